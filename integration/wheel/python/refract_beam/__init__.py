"""Refract, a portable Apache Beam runner, for Beam Python users.

`--runner=refract_beam.RefractRunner` runs a pipeline on a Refract server
this package starts (see `runner`); `pytest --refract` runs a suite's
TestPipelines there (see `pytest_plugin`).
"""

from refract_beam.runner import RefractRunner

__all__ = ['RefractRunner']
