"""pytest plugin recording how a test session ended, for summarize.py.

A session can stop before running every collected test without pytest
saying so in its exit status (pytest-timeout's `--session-timeout` stops it
with status 0 when no test failed), and the JUnit report lists only the
tests that ran. So when the environment variable REFRACT_SUITE_EVENTS names
a file, this plugin writes there, as JSON, the number of tests collected
(after -k / -m deselection), why the session stopped early if it did, its
exit status, and the events other plugins added to `EVENTS` (runner crashes
and timeouts, see refract_beam_plugin.py); summarize.py fails a run with
fewer tests than collected.

Load it with `-p refract_session_record` (its directory on PYTHONPATH).
"""

import json
import os

# Dicts: nodeid, kind ('crash' | 'timeout'), detail.
EVENTS = []

_collected = {'count': 0}


def pytest_collection_finish(session):
  _collected['count'] = len(session.items)


def pytest_sessionfinish(session, exitstatus):
  stop_reason = session.shouldstop or session.shouldfail or None
  path = os.environ.get('REFRACT_SUITE_EVENTS')
  if not path:
    return
  summary = {
    'collected': _collected['count'],
    'stop_reason': str(stop_reason) if stop_reason else None,
    'exitstatus': int(exitstatus),
    'events': EVENTS,
  }
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(summary, f, indent=1)
