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
  for given, what in ((location, '--refract_location'),
                      (os.environ.get('REFRACT_BIN'), 'REFRACT_BIN')):
    if given:
      if os.path.isfile(given) and os.access(given, os.X_OK):
        return given
      raise RefractNotFound(f'{what} names {given!r}, which is not an '
                            'executable file')
  looked = []
  for scheme in (None, f'{os.name}_user'):
    try:
      scripts = (
          sysconfig.get_path('scripts')
          if scheme is None else sysconfig.get_path('scripts', scheme))
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
      '(or set REFRACT_BIN)' % ', '.join(looked))


def tested_python_versions(binary):
  """The Beam Python versions (major.minor strings) `binary --version`
  says Refract was tested with."""
  out = subprocess.run([binary, '--version'],
                       check=True,
                       capture_output=True,
                       text=True,
                       timeout=30).stdout
  for line in out.splitlines():
    if line.startswith('tested with Apache Beam:'):
      for part in line.split(':', 1)[1].split(','):
        part = part.strip()
        if part.startswith('Python '):
          return re.findall(r'\d+\.\d+', part)
  raise RuntimeError(
      f'{binary} --version does not say which Beam versions it was tested '
      f'with (it printed {out!r}); is it a refract binary?')


def check_beam_version(beam_version, tested, binary):
  """Raises when `beam_version` (apache_beam's) is not a major.minor in
  `tested`; `REFRACT_SKIP_VERSION_CHECK=1` lets it run anyway."""
  minor = '.'.join(beam_version.split('.')[:2])
  if minor in tested or os.environ.get('REFRACT_SKIP_VERSION_CHECK') == '1':
    return
  raise RuntimeError(
      f'apache-beam {beam_version} is installed, but this Refract '
      f'({binary}) was tested with apache-beam {" and ".join(tested)}.x only. '
      'Install a matching apache-beam, or a refract-beam wheel built for '
      f'{minor}; set REFRACT_SKIP_VERSION_CHECK=1 to try anyway.')
