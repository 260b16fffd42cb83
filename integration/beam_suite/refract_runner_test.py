"""Beam's shared portable-runner test cases, run against Refract with none of
Prism's opt-outs.

`PrismRunnerTest` (from the apache-beam wheel) skips what Prism cannot do:
custom window coders and merging custom windows, and (through its parent
`PortableRunnerTest`) every drain test. This subclass of
`portable_runner_test.PortableRunnerTest` runs those cases too:

* Drain: Beam's drain tests build their pipeline with
  `create_pipeline(is_drain=True)`, which for Python's FnApiRunner means "start
  the job already draining". Refract offers the same through the pipeline
  experiment `drain_on_start` (`--experiments=drain_on_start`): every
  splittable DoFn's restrictions go through its truncate step before
  processing. `create_pipeline(is_drain=True)` below adds that experiment.
* Custom windows run as in the base class.
* The cross-language cases Beam runs only on Flink (a Java transform, a
  KafkaIO read that must fail with Kafka's own error, a KafkaIO expansion)
  run against the Java expansion service named by
  $REFRACT_JAVA_EXPANSION_SERVICE; Beam SQL against the one named by
  $REFRACT_SQL_EXPANSION_SERVICE.

The binary comes from the environment variable REFRACT_BIN. Run with
integration/refract_suite.sh.
"""

import os
import unittest

import apache_beam as beam
from apache_beam.options.pipeline_options import DebugOptions
from apache_beam.options.pipeline_options import PortableOptions
from apache_beam.runners.portability import flink_runner_test
from apache_beam.runners.portability import portable_runner_test
from apache_beam.runners.portability.fn_api_runner import fn_runner_test

DRAIN_EXPERIMENT = 'drain_on_start'
# 'localhost:PORT' of a Java expansion service (refract_suite.sh starts one).
JAVA_EXPANSION_SERVICE = 'REFRACT_JAVA_EXPANSION_SERVICE'
# 'localhost:PORT' of an expansion service for Beam SQL (refract_suite.sh
# starts integration/sql-expansion).
SQL_EXPANSION_SERVICE = 'REFRACT_SQL_EXPANSION_SERVICE'
# Experiments every pipeline of the suite adds, comma-separated (for one,
# `refract_shards=3` runs the whole suite on engine shards).
EXTRA_EXPERIMENTS = 'REFRACT_SUITE_EXPERIMENTS'


class RefractRunnerTest(portable_runner_test.PortableRunnerTest):
  _use_grpc = True
  _use_subprocesses = True

  @classmethod
  def _subprocess_command(cls, job_port, expansion_port):
    binary = os.environ.get('REFRACT_BIN')
    if not binary:
      raise unittest.SkipTest('REFRACT_BIN is not set')
    return [binary, '--job_port', str(job_port)]

  def create_options(self):
    options = super().create_options()
    options.view_as(PortableOptions).environment_type = 'LOOPBACK'
    debug = options.view_as(DebugOptions)
    debug.experiments = ['pre_optimize=default', 'beam_fn_api'] + list(debug.experiments or [])
    if getattr(self, 'bundle_attempts', None):
      debug.add_experiment('refract_bundle_attempts=%d' % self.bundle_attempts)
    for experiment in filter(None, os.environ.get(EXTRA_EXPERIMENTS, '').split(',')):
      debug.add_experiment(experiment)
    return options

  def create_pipeline(self, is_drain=False):
    options = self.create_options()
    if is_drain:
      options.view_as(DebugOptions).add_experiment(DRAIN_EXPERIMENT)
    return beam.Pipeline(self.get_runner(), options)

  # PortableRunnerTest skips these because portable runners could not drain.
  def test_sdf_with_truncate(self):
    fn_runner_test.FnApiRunnerTest.test_sdf_with_truncate(self)

  def test_sdf_default_truncate_when_bounded(self):
    fn_runner_test.FnApiRunnerTest.test_sdf_default_truncate_when_bounded(self)

  def test_sdf_default_truncate_when_unbounded(self):
    fn_runner_test.FnApiRunnerTest.test_sdf_default_truncate_when_unbounded(self)

  def test_draining_sdf_with_sdf_initiated_checkpointing(self):
    fn_runner_test.FnApiRunnerTest.test_draining_sdf_with_sdf_initiated_checkpointing(  # pylint: disable=line-too-long
      self
    )

  # Cross-language cases, with the Java expansion services refract_suite.sh
  # starts (Beam Java 2.73.0 with KafkaIO; Beam SQL 2.65.0); Beam runs them
  # only in its Flink suite, whose test bodies these call.
  def get_expansion_service(self):
    variable = getattr(self, 'expansion_service_variable', JAVA_EXPANSION_SERVICE)
    address = os.environ.get(variable)
    if not address:
      raise unittest.SkipTest('no expansion service (%s)' % variable)
    return address

  def _as_flink_test(self):
    # What the Flink suite's bodies read: LOOPBACK workers, no streaming.
    self.environment_type = 'LOOPBACK'
    self.enable_commit = False

  def test_external_transform(self):
    self._as_flink_test()
    flink_runner_test.FlinkRunnerTest.test_external_transform(self)

  def test_expand_kafka_read(self):
    # The Java worker's KafkaIO error must reach the client. The read is
    # unbounded, so the job streams, and a streaming job retries a failing
    # bundle for as long as it runs unless told otherwise.
    self._as_flink_test()
    self.bundle_attempts = 2
    flink_runner_test.FlinkRunnerTest.test_expand_kafka_read(self)

  def test_expand_kafka_write(self):
    self._as_flink_test()
    flink_runner_test.FlinkRunnerTest.test_expand_kafka_write(self)

  def test_sql(self):
    self._as_flink_test()
    self.expansion_service_variable = SQL_EXPANSION_SERVICE
    flink_runner_test.FlinkRunnerTest.test_sql(self)


if __name__ == '__main__':
  unittest.main()
