"""The web UI as headless Chromium renders it: a page's DOM after its
scripts ran, and screenshots kept as test artifacts.

Screenshots go to $REFRACT_ARTIFACTS/ui (default ~/.cache/refract/artifacts,
outside the clone), named by the test that took them; each run replaces
them."""

import os
import shutil
import subprocess

import pytest

# Long enough for the page's first refreshes (it polls every second).
VIRTUAL_TIME_MS = 3000


def _chromium():
  path = shutil.which('chromium') or shutil.which('chromium-browser')
  if not path:
    pytest.fail('chromium is not installed (integration/setup.sh installs it)', pytrace=False)
  return path


def _run(*args):
  done = subprocess.run(
    [
      _chromium(),
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-dev-shm-usage',
      '--virtual-time-budget=%d' % VIRTUAL_TIME_MS,
      *args,
    ],
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  return done.stdout


def page_dom(url):
  """The page at `url` after its scripts ran, as Chromium rendered it."""
  return _run('--dump-dom', url)


def artifacts_dir():
  root = os.environ.get('REFRACT_ARTIFACTS') or os.path.join(
    os.path.expanduser('~'), '.cache', 'refract', 'artifacts'
  )
  path = os.path.join(root, 'ui')
  os.makedirs(path, exist_ok=True)
  return path


def screenshot(url, name, width=1400, height=1800):
  """A PNG of the page at `url`, kept as `<artifacts>/ui/<name>.png`;
  returns its path."""
  path = os.path.join(artifacts_dir(), name + '.png')
  _run('--window-size=%d,%d' % (width, height), '--screenshot=' + path, url)
  assert os.path.getsize(path) > 0, path
  return path
