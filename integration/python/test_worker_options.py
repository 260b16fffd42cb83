"""The pipeline options python_worker.py (of the refract_beam package, in
integration/wheel/python/refract_beam) hands Beam's harness:
all it was provisioned with, less true booleans whose flag Beam cannot
parse back (a `--no_X` flag setting `X`, true by default), which the
harness would drop with a warning at every worker's start, keeping the
value it was given anyway. The console of a run without those warnings is
checked in test_cli_run.py."""

import importlib.util
import os

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.pipeline_options import TypeOptions

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(os.path.dirname(HERE), 'wheel', 'python', 'refract_beam', 'python_worker.py')


def python_worker():
  spec = importlib.util.spec_from_file_location('python_worker', WORKER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def option(name):
  return 'beam:option:%s:v1' % name


def test_only_true_options_beam_cannot_parse_back_are_left_out():
  given = {
    option('pipeline_type_check'): True,
    option('direct_runner_use_stacked_bundle'): True,
    # Parsed back as given: kept.
    option('save_main_session'): True,
    option('streaming'): True,
    option('job_name'): 'a-job',
    option('experiments'): ['a', 'b'],
    # Not an option the harness knows (a pipeline's own): kept, and
    # discarded by the harness as on any runner.
    option('my_own_flag'): True,
    # False: Beam writes no flag for it, so nothing to leave out.
    option('pipeline_type_check_strict'): False,
  }
  kept = python_worker().options_the_harness_reads(given)
  assert kept == {
    k: v
    for k, v in given.items()
    if k not in (option('pipeline_type_check'), option('direct_runner_use_stacked_bundle'))
  }


def test_the_harness_reads_the_same_values_from_what_is_kept(caplog):
  given = {
    option('pipeline_type_check'): True,
    option('streaming'): True,
    option('job_name'): 'a-job',
  }

  def as_harness_reads(options):
    # As sdk_worker_main does: portable names to plain ones.
    return PipelineOptions.from_dictionary(
      {k[len('beam:option:') : -len(':v1')]: v for k, v in options.items()}
    )

  before = as_harness_reads(given).get_all_options()
  assert 'Discarding unparseable args' in caplog.text
  caplog.clear()
  after = as_harness_reads(python_worker().options_the_harness_reads(given)).get_all_options()
  assert 'Discarding unparseable args' not in caplog.text
  assert before == after
  assert as_harness_reads(given).view_as(TypeOptions).pipeline_type_check
