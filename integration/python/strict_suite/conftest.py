"""A user project's conftest, as Beam's own: TestPipelines take the
options of `--test-pipeline-options`; the pipelines to run are the
`check_*` functions of wrong_pipelines.py."""

from apache_beam.testing.test_pipeline import TestPipeline


def pytest_addoption(parser):
  parser.addoption('--test-pipeline-options', default=None)


def pytest_configure(config):
  TestPipeline.pytest_test_pipeline_options = config.getoption('test_pipeline_options')
