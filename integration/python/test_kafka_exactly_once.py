"""Kafka in, Kafka out, exactly once, through repeated runner kills.

The Java pipeline org.refract.examples.KafkaExactlyOnce (integration/java)
reads numbered records from an input topic (read_committed, offsets
committed at bundle finalization), counts and sums them per key in 1 s
event-time windows and writes one record per window and key with KafkaIO's
exactly-once sink (`withEOS`: a `@RequiresStableInput` writer committing
Kafka transactions). It runs streaming on a durable `refract serve
--state_dir`, its SDK workers in a Java worker pool of their own (an
EXTERNAL environment), which outlives the runner.

While a producer thread feeds the input topic, the server is SIGKILLed
several times and started again on the same state directory and port; the
job resumes from its last checkpoint each time. A `read_committed` consumer
of the output topic must then see exactly the results computed here from
the input: no window lost, none written twice. The input consumer group's
committed offsets only move forward and end at the end of the input.

Event time is each record's create time, set by the producer; the pipeline's
watermark follows the largest create time read (never the wall clock), so
the windows are the same whatever the timing, and a last record per
partition far ahead in event time closes them all.
"""

import os
import random
import signal
import threading
import time
from collections import Counter

import grpc
import pytest
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.portability.api import beam_job_api_pb2_grpc

import xlang_services
from refract_testlib import (
  durable_server,
  free_port,
  job_messages,
  job_state,
  submit_java,
  wait_for_end,
)

# The first run may build integration/java with an empty Maven cache.
pytestmark = pytest.mark.timeout(600)

PIPELINE_MAIN = 'org.refract.examples.KafkaExactlyOnce'
INPUT_TOPIC = 'eos-input'
OUTPUT_TOPIC = 'eos-output'
INPUT_GROUP = 'refract-eos-input'
SINK_GROUP = 'refract-eos-group'
INPUT_PARTITIONS = 2

KEYS = 5
RECORDS = 3000
STEP_MS = 10  # event time between consecutive records: 100 per window
WINDOW_MS = 1000
# A fixed, past event time: the windows do not depend on when the test runs.
BASE_MS = 1_700_000_000_000
# The first FIRST records go out at once; the rest, once the job wrote its
# first results, at CHUNK records every CHUNK_PAUSE_S (about 18 s), so that
# the kills land while records are flowing.
FIRST = 300
CHUNK = 15
CHUNK_PAUSE_S = 0.1
KILLS = int(os.environ.get('REFRACT_EOS_KILLS', '4'))
CHECKPOINT_INTERVAL = '200ms'


def record(i):
  """Input record i: (partition, key, value, create time in ms)."""
  k = i % KEYS
  return k % INPUT_PARTITIONS, 'k%d' % k, i, BASE_MS + i * STEP_MS


def expected_output(records):
  """The output records (key, value) the pipeline must write, as a multiset:
  one per window and key, each exactly once."""
  windows = {}
  for i in range(records):
    _, key, value, ts = record(i)
    start = ts - ts % WINDOW_MS
    count_sum = windows.setdefault((key, start), [0, 0])
    count_sum[0] += 1
    count_sum[1] += value
  return Counter(
    (key, '%s@%d count=%d sum=%d' % (key, start, c, s)) for (key, start), (c, s) in windows.items()
  )


class InputProducer(threading.Thread):
  """Writes the input at a steady pace, then one record per partition far
  ahead in event time (key 'end', never in a closed window), which moves the
  watermark past every window of the input."""

  def __init__(self, bootstrap):
    super().__init__(daemon=True)
    self.bootstrap = bootstrap
    self.sent = 0
    self.error = None
    self.stopping = threading.Event()
    self.go_on = threading.Event()
    self.done = threading.Event()

  def run(self):
    from kafka import KafkaProducer

    try:
      producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks='all', linger_ms=5)
      try:
        for start in range(0, RECORDS, CHUNK):
          if self.stopping.is_set():
            return
          for i in range(start, min(start + CHUNK, RECORDS)):
            partition, key, value, ts = record(i)
            producer.send(
              INPUT_TOPIC,
              key=key.encode(),
              value=str(value).encode(),
              partition=partition,
              timestamp_ms=ts,
            )
          producer.flush()
          self.sent = min(start + CHUNK, RECORDS)
          if self.sent >= FIRST:
            while not (self.go_on.is_set() or self.stopping.is_set()):
              self.go_on.wait(0.2)
            self.stopping.wait(CHUNK_PAUSE_S)
        end_ts = BASE_MS + RECORDS * STEP_MS + 10 * WINDOW_MS
        for partition in range(INPUT_PARTITIONS):
          producer.send(
            INPUT_TOPIC, key=b'end', value=b'0', partition=partition, timestamp_ms=end_ts
          )
        producer.flush()
      finally:
        producer.close()
    except Exception as e:  # pylint: disable=broad-except
      self.error = e
    finally:
      self.done.set()


class OutputReader:
  """A read_committed consumer of the output topic, from its beginning."""

  def __init__(self, bootstrap):
    from kafka import KafkaConsumer, TopicPartition

    self.consumer = KafkaConsumer(
      bootstrap_servers=bootstrap,
      group_id=None,
      isolation_level='read_committed',
      enable_auto_commit=False,
      auto_offset_reset='earliest',
    )
    self.consumer.assign([TopicPartition(OUTPUT_TOPIC, 0)])
    self.consumer.seek_to_beginning()
    self.records = []

  def poll(self, seconds):
    deadline = time.monotonic() + seconds
    while True:
      left = deadline - time.monotonic()
      if left <= 0:
        return len(self.records)
      for batch in self.consumer.poll(timeout_ms=int(min(left, 0.5) * 1000)).values():
        self.records.extend((r.key.decode(), r.value.decode()) for r in batch)

  def close(self):
    self.consumer.close()


def create_topics(bootstrap):
  from kafka.admin import KafkaAdminClient, NewTopic

  admin = KafkaAdminClient(bootstrap_servers=bootstrap)
  try:
    admin.create_topics(
      [
        NewTopic(INPUT_TOPIC, INPUT_PARTITIONS, 1),
        NewTopic(OUTPUT_TOPIC, 1, 1),
      ]
    )
  finally:
    admin.close()


class InputOffsets:
  """The input group's committed offsets and the input's end offsets, read
  by a consumer that never joins the group (nor commits)."""

  def __init__(self, bootstrap):
    from kafka import KafkaConsumer, TopicPartition

    self.consumer = KafkaConsumer(
      bootstrap_servers=bootstrap, group_id=INPUT_GROUP, enable_auto_commit=False
    )
    self.partitions = [TopicPartition(INPUT_TOPIC, p) for p in range(INPUT_PARTITIONS)]

  def committed(self):
    """{partition: committed offset}, 0 for none yet."""
    return {tp.partition: self.consumer.committed(tp) or 0 for tp in self.partitions}

  def end(self):
    return {
      tp.partition: offset for tp, offset in self.consumer.end_offsets(self.partitions).items()
    }

  def close(self):
    self.consumer.close()


def only_job(endpoint):
  with grpc.insecure_channel(endpoint) as channel:
    jobs = (
      beam_job_api_pb2_grpc.JobServiceStub(channel)
      .GetJobs(beam_job_api_pb2.GetJobsRequest(), timeout=10)
      .job_info
    )
  assert len(jobs) == 1, jobs
  return jobs[0].job_id


def cancel(endpoint, job_id):
  with grpc.insecure_channel(endpoint) as channel:
    beam_job_api_pb2_grpc.JobServiceStub(channel).Cancel(
      beam_job_api_pb2.CancelJobRequest(job_id=job_id), timeout=30
    )


def note(started, text):
  """A line of the test's timeline (shown with -s, and in a failure's
  captured output)."""
  print('[%6.2fs] %s' % (time.monotonic() - started, text), flush=True)


def wait_for_resume(server, timeout_s=60):
  """Waits until a restarted server has the job running again on new
  workers (it logs that it resumes from the checkpoint then)."""
  deadline = time.monotonic() + timeout_s
  while 'resuming from the job' not in server.log_tail(1 << 20):
    assert time.monotonic() < deadline, server.log_tail()
    time.sleep(0.1)


def kill_and_restart(servers, refract_bin, state_dir, port, log):
  """SIGKILLs the latest server and whatever is left of its process group,
  then starts another on the same state directory and port."""
  last = servers[-1]
  last.proc.send_signal(signal.SIGKILL)
  last.proc.wait()
  try:
    os.killpg(last.proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  servers.append(durable_server(refract_bin, state_dir, port, log, CHECKPOINT_INTERVAL))


@pytest.fixture
def kafka(tmp_path):
  processes = []
  with xlang_services.kafka_broker(tmp_path, process=processes) as bootstrap:
    yield bootstrap, processes[0]


def submit(java_classpath, endpoint, pool, bootstrap, log, extra=()):
  """Submits the streaming job with the Java client, which leaves once the
  server has it; returns the job id."""
  code, text = submit_java(
    java_classpath,
    PIPELINE_MAIN,
    endpoint,
    pool,
    log,
    '--bootstrapServers=' + bootstrap,
    '--inputTopic=' + INPUT_TOPIC,
    '--outputTopic=' + OUTPUT_TOPIC,
    '--inputGroup=' + INPUT_GROUP,
    '--sinkGroup=' + SINK_GROUP,
    '--windowMillis=%d' % WINDOW_MS,
    *extra,
  )
  assert code == 0 and 'submitted' in text, text[-4000:]
  return only_job(endpoint)


def describe(got, want):
  missing = want - got
  extra = got - want
  lines = ['%d records read, %d expected' % (sum(got.values()), sum(want.values()))]
  if missing:
    lines.append('missing (%d): %s' % (sum(missing.values()), sorted(missing.elements())[:20]))
  if extra:
    lines.append(
      'duplicated or wrong (%d): %s' % (sum(extra.values()), sorted(extra.elements())[:20])
    )
  return '\n'.join(lines)


# 'shards': the job on three engine shards, each checkpoint an epoch all
# three cut: the sink's transactions and the source's offsets follow the
# epochs as they follow one engine's checkpoints.
@pytest.mark.parametrize(
  'extra', [(), ('--experiments=refract_shards=3',)], ids=['one_engine', 'shards']
)
def test_runner_killed_repeatedly_writes_each_window_exactly_once(
  request, refract_bin, tmp_path, kafka, worker_pool, java_classpath, extra
):
  bootstrap, broker = kafka
  pool, pool_process = worker_pool
  rng = random.Random(os.environ.get('REFRACT_EOS_SEED', '11'))
  create_topics(bootstrap)
  want = expected_output(RECORDS)
  state_dir = tmp_path / 'state'
  port = free_port()
  servers = [
    durable_server(refract_bin, state_dir, port, tmp_path / 'refract-0.log', CHECKPOINT_INTERVAL)
  ]
  # conftest.py attaches these logs to a failing test's report.
  request.node.refract_processes = servers + [pool_process, broker]
  producer = InputProducer(bootstrap)
  reader = OutputReader(bootstrap)
  offsets = InputOffsets(bootstrap)
  job = None
  started = time.monotonic()
  try:
    job = submit(
      java_classpath, servers[-1].endpoint, pool, bootstrap, tmp_path / 'client.log', extra
    )
    producer.start()
    # The first results mean the workers are up and windows are closing;
    # the sink's writer has committed its first transaction and (its state
    # being checkpointed every 200 ms) a second on from there its state too.
    deadline = time.monotonic() + 90
    while reader.poll(0.5) == 0:
      assert time.monotonic() < deadline, 'no output within 90 s\n' + servers[-1].log_tail()
    time.sleep(1)
    if extra:
      said = job_messages(servers[-1].endpoint, job)
      assert any('running on 3 engine shards' in m for m in said), said
    producer.go_on.set()
    note(started, 'first output; %d records produced' % producer.sent)
    offsets_seen = [offsets.committed()]
    kills = []
    for attempt in range(KILLS):
      time.sleep(rng.uniform(1.0, 2.5))
      assert job_state(servers[-1].endpoint, job) == 'RUNNING', servers[-1].log_tail()
      kills.append(producer.sent)
      note(
        started,
        'kill %d; %d records produced, %d results read'
        % (attempt + 1, producer.sent, reader.poll(0.2)),
      )
      kill_and_restart(
        servers, refract_bin, state_dir, port, tmp_path / ('refract-%d.log' % (attempt + 1))
      )
      # The next kill lands while the job runs again, not while its
      # workers start.
      wait_for_resume(servers[-1])
      note(started, 'resumed; %d records produced' % producer.sent)
      request.node.refract_processes = servers + [pool_process, broker]
      offsets_seen.append(offsets.committed())
    producer.done.wait(60)
    assert producer.error is None, producer.error
    note(started, 'all %d records produced' % RECORDS)
    # At least three kills landed while input was still being produced.
    assert sum(1 for sent in kills if sent < RECORDS) >= min(3, KILLS), kills
    # Everything expected, then a little longer: a duplicate would come
    # after the last expected record.
    deadline = time.monotonic() + 90
    while reader.poll(1) < sum(want.values()):
      if time.monotonic() > deadline:
        break
    reader.poll(3)
    got = Counter(reader.records)
    assert got == want, describe(got, want)
    # Offsets are committed when bundles are finalized: they only move
    # forward, and reach the end of the input (the two 'end' records too).
    end = offsets.end()
    deadline = time.monotonic() + 30
    while offsets.committed() != end:
      assert time.monotonic() < deadline, (offsets.committed(), end)
      time.sleep(0.5)
    offsets_seen.append(offsets.committed())
    for before, after in zip(offsets_seen, offsets_seen[1:], strict=False):
      for partition, offset in before.items():
        assert after.get(partition, -1) >= offset, offsets_seen
    assert job_state(servers[-1].endpoint, job) == 'RUNNING'
    cancel(servers[-1].endpoint, job)
    assert wait_for_end(servers[-1], job, timeout_s=60) == 'CANCELLED'
    job = None
  finally:
    producer.stopping.set()
    if producer.is_alive():
      producer.join(30)
    reader.close()
    offsets.close()
    if job is not None:
      try:
        cancel(servers[-1].endpoint, job)
      except grpc.RpcError:
        pass
    for s in servers:
      s.stop()
