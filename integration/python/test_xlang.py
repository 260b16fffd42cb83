"""Cross-language pipelines: Python pipelines with Java transforms.

The Java transforms come from Beam's Java expansion service (KafkaIO 2.73.0,
see integration/xlang/pom.xml), started once for this module together with
a one-node Kafka broker (integration/kafka/pom.xml); see xlang_services.py.
The expansion service answers with a `beam:env:anyof:v1` environment (a
Docker image, or EXTERNAL: the worker pool inside the service's JVM), so a
runner must pick the EXTERNAL choice to run them without Docker.

Every test runs on two runners:
  prism    Prism, Beam's Go runner (built by refract_prism_bin), the
           reference that shows the services and the pipelines are right;
  refract  `refract serve` (REFRACT_BIN), the runner under test, which
           picks the EXTERNAL alternative;
  refract-sdk-image  the same, picking the Docker alternative, which with
           no Docker engine runs Beam's Java SDK image as a local process.
"""

import tempfile
import uuid

import apache_beam as beam
import pytest
from apache_beam.io.external.generate_sequence import GenerateSequence
from apache_beam.io.kafka import ReadFromKafka
from apache_beam.io.kafka import WriteToKafka
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to

import xlang_services
from refract_testlib import RefractServer, serving

# The first test may also resolve the Java classpaths with Maven (about
# 1.5 minutes on an empty cache) and build Prism (about 2.5 minutes), both
# cached in ~/.cache/refract afterwards: more than the suite's default
# per-test limit.
pytestmark = pytest.mark.timeout(600)

KAFKA_RECORDS = 1000


@pytest.fixture(autouse=True)
def beam_temp_dirs_under_tmp_path(tmp_path, monkeypatch):
  """Beam's Python SDK leaves two empty temporary directories behind for
  every portable job it submits: they go under the test's tmp_path, which
  pytest prunes, instead of /tmp."""
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))


@pytest.fixture(scope='module')
def service_processes():
  """The module's service processes, for the logs of a failing test."""
  return []


@pytest.fixture(scope='module')
def java_expansion_service(tmp_path_factory, service_processes):
  with xlang_services.java_expansion_service(
    tmp_path_factory.mktemp('java-expansion'), process=service_processes
  ) as endpoint:
    yield endpoint


@pytest.fixture(scope='module')
def kafka_bootstrap(tmp_path_factory, service_processes):
  with xlang_services.kafka_broker(
    tmp_path_factory.mktemp('kafka'), process=service_processes
  ) as bootstrap:
    yield bootstrap


@pytest.fixture(scope='module')
def prism_endpoint(tmp_path_factory, service_processes):
  with xlang_services.prism_job_server(
    tmp_path_factory.mktemp('prism'), process=service_processes
  ) as endpoint:
    yield endpoint


@pytest.fixture
def refract_with_sdk_images(request, refract_bin, tmp_path):
  """A `refract serve` that starts the Docker alternative of an AnyOf
  environment (`--environment_preference=docker`): with no Docker engine
  here, Beam's Java SDK image runs as a local FnHarness over the jars the
  expansion service staged."""
  server = RefractServer(
    refract_bin, tmp_path / 'refract-sdk-images.log', extra_args=['--environment_preference=docker']
  )
  with serving(request, server):
    yield server


@pytest.fixture(params=['prism', 'refract', 'refract-sdk-image'])
def runner_options(request, service_processes):
  """Pipeline options that run a pipeline on the runner named by the
  parameter, its Python transforms in LOOPBACK workers."""
  if request.param == 'prism':
    args = [
      '--runner=PortableRunner',
      '--job_endpoint=%s' % request.getfixturevalue('prism_endpoint'),
      '--environment_type=LOOPBACK',
    ]
  elif request.param == 'refract':
    # conftest.py's fixture: a fresh `refract serve`, whose log a failing
    # test's report shows.
    args = request.getfixturevalue('refract_server').portable_args()
  else:
    args = request.getfixturevalue('refract_with_sdk_images').portable_args()
  # Module-scoped fixtures are set up before this one, so the list already
  # holds every service this test uses.
  request.node.refract_processes = list(getattr(request.node, 'refract_processes', [])) + list(
    service_processes
  )
  return PipelineOptions(args)


def test_generate_sequence(runner_options, java_expansion_service):
  with beam.Pipeline(options=runner_options) as p:
    numbers = p | GenerateSequence(start=0, stop=10, expansion_service=java_expansion_service)
    assert_that(numbers, equal_to(list(range(10))))


def records_in_topic(bootstrap, topic):
  """How many records the topic holds, read from its partitions' offsets."""
  from kafka import KafkaConsumer, TopicPartition

  consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
  try:
    partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    ends = consumer.end_offsets(partitions)
    starts = consumer.beginning_offsets(partitions)
    return sum(ends[tp] - starts[tp] for tp in partitions)
  finally:
    consumer.close()


def test_kafka_write_then_read(runner_options, java_expansion_service, kafka_bootstrap):
  # A topic of its own for each run, so the runners' runs cannot meet.
  topic = 'refract-xlang-%s' % uuid.uuid4().hex[:12]
  records = [(b'key-%04d' % i, b'value-%04d' % i) for i in range(KAFKA_RECORDS)]

  with beam.Pipeline(options=runner_options) as p:
    _ = (
      p
      | beam.Create(records).with_output_types(tuple[bytes, bytes])
      | WriteToKafka(
        producer_config={'bootstrap.servers': kafka_bootstrap},
        topic=topic,
        expansion_service=java_expansion_service,
      )
    )
  # Checked outside Beam, so a failure says which of the two jobs failed.
  assert records_in_topic(kafka_bootstrap, topic) == KAFKA_RECORDS

  with beam.Pipeline(options=runner_options) as p:
    read = p | ReadFromKafka(
      consumer_config={
        'bootstrap.servers': kafka_bootstrap,
        'auto.offset.reset': 'earliest',
      },
      topics=[topic],
      max_num_records=KAFKA_RECORDS,
      expansion_service=java_expansion_service,
    )
    assert_that(read, equal_to(records))


def test_kafka_read_through_beam_services(runner_options, java_expansion_service, kafka_bootstrap):
  """`ReadFromKafka` with no `expansion_service`: Python looks up Beam's IO
  expansion service by its Gradle target, which `--beam_services` (or the
  BEAM_SERVICE_OVERRIDES environment variable) maps to a running service,
  so the pipeline needs no Beam jar download and no edit to run here."""
  topic = 'refract-xlang-%s' % uuid.uuid4().hex[:12]
  records = [(b'key-%02d' % i, b'value-%02d' % i) for i in range(20)]
  from kafka import KafkaProducer

  producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
  try:
    for key, value in records:
      producer.send(topic, key=key, value=value)
    producer.flush()
  finally:
    producer.close()

  options = runner_options.get_all_options(drop_default=True)
  options['beam_services'] = {'sdks:java:io:expansion-service:shadowJar': java_expansion_service}
  with beam.Pipeline(options=PipelineOptions.from_dictionary(options)) as p:
    read = p | ReadFromKafka(
      consumer_config={
        'bootstrap.servers': kafka_bootstrap,
        'auto.offset.reset': 'earliest',
      },
      topics=[topic],
      max_num_records=len(records),
    )
    assert_that(read, equal_to(records))
