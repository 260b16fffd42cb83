"""Checkpoint and restore time against state size, with the state
directory's RocksDB and with an S3-compatible object store (SeaweedFS,
built and started here), in one run; prints a table.

    integration/bench/checkpoint_store.py --bin target/release/refract
        [--kb 0,16,64] [--events 2000] [--interval 1s]

For each store and each size: a durable server runs
integration/python/recovery_pipeline.py with --keep_all_kb K, which keeps
every number with K KiB of ballast in one bag per key until the input
ends, so the job's state grows to about events x K KiB. Once most of the
input is in, the server's /metrics give the checkpoints so far (count,
time spent writing them, bytes written, the latest one's size). Then the
server is killed (SIGKILL) and started again on the same state directory
and bucket; the restore time is from the new server's start to its log
saying it resumed the job from its checkpoint (reading the job's record,
its checkpoint and staged files, and restoring the engine). The job then
runs to DONE, and its results are checked against the model.
"""

import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(os.path.dirname(HERE), 'python')
sys.path.insert(0, PYTHON_DIR)

# pylint: disable=wrong-import-position
from refract_testlib import RefractServer, free_port  # noqa: E402
from seaweedfs import SeaweedS3  # noqa: E402
from test_recovery import (  # noqa: E402
  BOOT,
  PIPELINE,
  expected_kept,
  expected_results,
  kill_group,
  read_kept,
  read_results,
  wait_for_end,
)

METRICS = (
  'refract_checkpoints_total',
  'refract_checkpoint_seconds_total',
  'refract_checkpoint_written_bytes_total',
  'refract_checkpoint_size_bytes',
)


def metric(text, name):
  """The value of `name` in Prometheus text (the job's only series)."""
  for line in text.splitlines():
    if line.startswith(name + '{') or line.startswith(name + ' '):
      return float(line.rsplit(' ', 1)[1])
  return 0.0


def scrape(ui):
  with urllib.request.urlopen(ui + '/metrics', timeout=10) as response:
    text = response.read().decode()
  return {name: metric(text, name) for name in METRICS}


def log_seconds(line):
  """The time of a server log line (its leading RFC 3339 stamp)."""
  stamp = line.split(' ', 1)[0].rstrip('Z')
  return datetime.fromisoformat(stamp[:26]).replace(tzinfo=timezone.utc).timestamp()


def resumed_after(log_path, started_wall, timeout_s=300):
  """Seconds from `started_wall` to the log's line saying the job resumed."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    with open(log_path, encoding='utf-8', errors='replace') as f:
      for line in f:
        if "resuming from the job's checkpoint" in line:
          return log_seconds(re.sub(r'\x1b\[[0-9;]*m', '', line)) - started_wall
    time.sleep(0.1)
  raise RuntimeError('the job did not resume within %ss' % timeout_s)


class Run:
  """One store and size: a server, the job, the numbers."""

  def __init__(self, binary, work, s3, kb, events, interval):
    self.binary, self.work, self.s3 = binary, work, s3
    self.kb, self.events, self.interval = kb, events, interval
    self.port, self.ui_port = free_port(), free_port()
    self.output = os.path.join(work, 'out')
    os.mkdir(self.output)

  def server(self, n):
    args = [
      '--state_dir',
      os.path.join(self.work, 'state'),
      '--checkpoint_interval',
      self.interval,
      '--ui_port',
      str(self.ui_port),
    ]
    env = None
    if self.s3:
      args += [
        '--checkpoint_store',
        's3://%s/jobs-%s' % (self.s3.bucket, os.path.basename(self.work)),
      ]
      env = {**os.environ, **self.s3.env()}
    log = os.path.join(self.work, 'refract-%d.log' % n)
    return RefractServer(self.binary, log, port=self.port, extra_args=args, env=env), log

  def submit(self, endpoint):
    done = subprocess.run(
      [
        sys.executable,
        PIPELINE,
        '--job_endpoint',
        endpoint,
        '--output',
        self.output,
        '--events',
        str(self.events),
        '--boot',
        BOOT,
        '--keep_all_kb',
        str(self.kb),
      ],
      capture_output=True,
      text=True,
      check=True,
    )
    return done.stdout.strip().splitlines()[-1]

  def measure(self):
    first, _ = self.server(1)
    first.wait_ready()
    ui = 'http://127.0.0.1:%d' % self.ui_port
    try:
      job = self.submit(first.endpoint)
      # Most of the input in: the state is near its full size.
      deadline = time.monotonic() + 600
      while True:
        seen = scrape(ui)
        if seen['refract_checkpoint_size_bytes'] >= 0.6 * self.events * self.kb * 1024 and (
          seen['refract_checkpoints_total'] >= 3
        ):
          break
        if time.monotonic() > deadline:
          raise RuntimeError('the state did not grow:\n%s' % first.log_tail())
        time.sleep(0.5)
      first.proc.send_signal(signal.SIGKILL)
      first.proc.wait()
    finally:
      first.stop()
      kill_group(first)
    started = time.time()
    second, log = self.server(2)
    second.wait_ready()
    try:
      restore_s = resumed_after(log, started)
      state = wait_for_end(second, job, timeout_s=900)
      if state != 'DONE':
        raise RuntimeError('the job ended %s:\n%s' % (state, second.log_tail()))
    finally:
      second.stop()
      kill_group(second)
    exact = (
      read_kept(self.output) == expected_kept(self.events)
      if self.kb
      else read_results(self.output) == expected_results(self.events)
    )
    if not exact:
      raise RuntimeError("the results are not the model's")
    count = max(seen['refract_checkpoints_total'], 1)
    return {
      'size_mib': seen['refract_checkpoint_size_bytes'] / (1 << 20),
      'checkpoints': int(seen['refract_checkpoints_total']),
      'ms_per_checkpoint': 1000 * seen['refract_checkpoint_seconds_total'] / count,
      'mib_per_checkpoint': seen['refract_checkpoint_written_bytes_total'] / count / (1 << 20),
      'restore_s': restore_s,
    }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--bin', required=True)
  parser.add_argument('--kb', default='0,16,64', help='KiB of state per number, comma-separated')
  parser.add_argument('--events', type=int, default=2000)
  parser.add_argument('--interval', default='1s')
  args = parser.parse_args()
  sizes = [int(k) for k in args.kb.split(',')]
  rows = []
  with tempfile.TemporaryDirectory(prefix='refract-store-bench-') as root:
    s3 = SeaweedS3(pathlib.Path(root) / 's3').start()
    try:
      for kb in sizes:
        for store in ('local', 'object store'):
          work = tempfile.mkdtemp(dir=root, prefix='run-')
          run = Run(
            args.bin, work, s3 if store == 'object store' else None, kb, args.events, args.interval
          )
          rows.append((store, kb, run.measure()))
    finally:
      s3.stop()
  print(
    '| store | KiB per number | state MiB | checkpoints | ms per checkpoint '
    '| MiB written per checkpoint | restore s |'
  )
  print('|---|---:|---:|---:|---:|---:|---:|')
  for store, kb, r in rows:
    print(
      '| %s | %d | %.1f | %d | %.0f | %.2f | %.2f |'
      % (
        store,
        kb,
        r['size_mib'],
        r['checkpoints'],
        r['ms_per_checkpoint'],
        r['mib_per_checkpoint'],
        r['restore_s'],
      )
    )


if __name__ == '__main__':
  main()
