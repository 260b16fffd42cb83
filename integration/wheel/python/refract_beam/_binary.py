"""Finding the `refract` binary, and what it was tested with.

The wheel installs the binary as a script of the environment it is
installed into (`<venv>/bin/refract`, or the user scheme's bin directory),
so the package looks there, for the interpreter that runs it, before
`PATH`: a `refract` elsewhere on `PATH` may be another version.
"""

import os
import re
import shutil
import subprocess
import sysconfig

_NAME = 'refract'


class RefractNotFound(RuntimeError):
  """No `refract` binary where the package looks."""


def find(location=None):
  """The binary to run: `location` (a `--refract_location`), else
  `$REFRACT_BIN`, else the one this package installed, else `PATH`'s."""
  for given, what in (
    (location, '--refract_location'),
    (os.environ.get('REFRACT_BIN'), 'REFRACT_BIN'),
  ):
    if given:
      if os.path.isfile(given) and os.access(given, os.X_OK):
        return given
      raise RefractNotFound(f'{what} names {given!r}, which is not an executable file')
  looked = []
  for scheme in (None, f'{os.name}_user'):
    try:
      scripts = (
        sysconfig.get_path('scripts') if scheme is None else sysconfig.get_path('scripts', scheme)
      )
    except KeyError:
      continue
    candidate = os.path.join(scripts, _NAME)
    looked.append(candidate)
    if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
      return candidate
  on_path = shutil.which(_NAME)
  if on_path:
    return on_path
  raise RefractNotFound(
    'cannot find the refract binary: looked at %s and on PATH; install the '
    'refract-beam wheel into this environment, or pass --refract_location '
    '(or set REFRACT_BIN)' % ', '.join(looked)
  )


def supported_python_range(binary):
  """The (lowest, newest) Beam Python minor versions, as (major, minor)
  tuples, that `binary --version` says Refract runs; a binary that lists
  versions instead of a range (older builds) supports just those."""
  out = subprocess.run(
    [binary, '--version'], check=True, capture_output=True, text=True, timeout=30
  ).stdout
  for line in out.splitlines():
    if line.startswith('tested with Apache Beam:'):
      for part in line.split(':', 1)[1].split(','):
        part = part.strip()
        if part.startswith('Python '):
          found = [(int(major), int(minor)) for major, minor in re.findall(r'(\d+)\.(\d+)', part)]
          if found:
            return min(found), max(found)
  raise RuntimeError(
    f'{binary} --version does not say which Beam versions it was tested '
    f'with (it printed {out!r}); is it a refract binary?'
  )


def _minor(version):
  """'2.78.0' -> (2, 78); None where it has no major.minor."""
  match = re.match(r'(\d+)\.(\d+)', version)
  return (int(match.group(1)), int(match.group(2))) if match else None


def _text(minor):
  return '%d.%d' % minor


class UnsupportedBeamVersion(RuntimeError):
  """apache-beam older than any version Refract supports."""


def check_beam_version(beam_version, supported, binary):
  """Refuses an apache-beam older than the `supported` (lowest, newest)
  range, naming the range; returns a one-line warning for one newer than
  any tested (it runs), else None. `REFRACT_SKIP_VERSION_CHECK=1` lets an
  older one run too."""
  lowest, newest = supported
  minor = _minor(beam_version)
  if minor is None or lowest <= minor <= newest:
    return None
  if minor > newest:
    return (
      f'apache-beam {beam_version} is newer than any Refract '
      f'({binary}) was tested with ({_text(lowest)} to '
      f'{_text(newest)}); running it anyway.'
    )
  if os.environ.get('REFRACT_SKIP_VERSION_CHECK') == '1':
    return None
  raise UnsupportedBeamVersion(
    f'apache-beam {beam_version} is older than this Refract ({binary}) '
    f'supports: it runs apache-beam {_text(lowest)} to {_text(newest)} '
    f'(and newer, untested). Install apache-beam>={_text(lowest)}; set '
    'REFRACT_SKIP_VERSION_CHECK=1 to try anyway.'
  )
