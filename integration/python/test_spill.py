"""A batch GroupByKey larger than its share of `--memory_budget` spills to
disk and still completes with every value, exactly once, under its key.

The server gets a 16 MiB budget; the pipeline (gbk_spill_pipeline.py)
groups 200 MiB of incompressible 64 KiB values under 1 000 keys and
checks the totals in the pipeline itself. The runner says in the job's
messages how much it spilled; its spill directory is empty afterwards.
The same, smaller, with the default spill directory (a temporary one the
server creates and removes when it stops); and grouped in session
windows, which the runner finds only by merging each key's spilled
pieces. (Peak memory is measured by integration/bench/gbk_spill_memory.py,
not asserted here.)
"""

import os
import subprocess
import sys

import pytest

from refract_testlib import RefractServer

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize(
    'spill_dir_flag,total_mb,keys,session_len',
    [(True, 200, 1000, 0), (False, 96, 1000, 0), (True, 96, 100, 4)],
    ids=['spill_dir', 'default_spill_dir', 'sessions'])
def test_a_groupbykey_larger_than_the_memory_budget_spills_and_completes(
    request, refract_bin, tmp_path, spill_dir_flag, total_mb, keys,
    session_len):
  spill_dir = tmp_path / 'spill'
  extra = ['--memory_budget', '16m', '--serve_http=false']
  if spill_dir_flag:
    extra += ['--spill_dir', str(spill_dir)]
  server = RefractServer(
      refract_bin, tmp_path / 'refract-serve.log', extra_args=extra)
  request.node.refract_processes = [server]
  try:
    server.wait_ready()
    run = subprocess.run(
        [sys.executable, os.path.join(HERE, 'gbk_spill_pipeline.py'),
         server.endpoint, str(total_mb), '64', str(keys), '0',
         str(session_len)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == 'DONE', run.stdout
    log = server.log_tail(1 << 20)
  finally:
    server.stop()
  spilled = [l for l in log.splitlines() if 'engine finished' in l]
  assert spilled and 'spilled_bytes=' in spilled[-1], log[-3000:]
  assert 'spilled_bytes=0 ' not in spilled[-1] + ' ', spilled[-1]
  # Spilled bytes are deleted as windows are emitted (RocksDB's own files
  # stay, without the data).
  assert sum(f.stat().st_size for f in spill_dir.rglob('*.sst')) < 1 << 20
