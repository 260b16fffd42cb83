"""Summarizes a pytest JUnit XML report and applies Refract's pass bar.

  python summarize.py --junit junit.xml [--events events.json] [--bar N]
                      [--all-must-pass] [--pytest-exit CODE] [--label NAME]
                      [--record FILE]
  python summarize.py --total FILE


Prints the failed and errored tests (one line each), the runner crashes and
timeouts recorded by refract_beam_plugin, and a closing count line
"NAME: P passed, F failed, S skipped, E errors". Exits non-zero when:
  * fewer than N tests passed;
  * any test hit the per-test timeout, or the runner process died;
  * the session stopped before running every collected test;
  * pytest itself exited with a status other than 0 (all passed) or 1 (some
    tests failed), e.g. 5 (no tests collected), 2 (interrupted), 3, 4;
  * with --all-must-pass, any test failed or errored.

--record appends the counts as one JSON line to FILE; --total FILE adds up
such lines and prints "total: P passed, F failed, S skipped" (errors count as
failures there).
"""

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET

_TIMEOUT_MARK = 'from pytest-timeout'
_CRASH_MARK = 'Subprocess terminated unexpectedly'


_EXC_LINE = re.compile(r'^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*')


def _clip(line, limit=200):
  return line if len(line) <= limit else line[: limit - 3] + '...'


def _first_line(text, limit=200):
  for line in (text or '').splitlines():
    line = line.strip()
    if line:
      return _clip(line, limit)
  return ''


def _reason(message):
  """One line saying why a test failed: the first line of the failure, and
  when that only opens a traceback (a remote SDK error), the innermost
  exception line of that traceback."""
  first = _first_line(message)
  if not first.endswith('Traceback (most recent call last):'):
    return first
  lines = (message or '').splitlines()
  inner = [line.strip() for line in lines[1:] if _EXC_LINE.match(line)]
  head = first[: -len('Traceback (most recent call last):')].rstrip()
  return _clip('%s ... %s' % (head, inner[-1])) if inner else first


def _short_name(case):
  cls = case.get('classname', '').rsplit('.', 1)[-1]
  return '%s::%s' % (cls, case.get('name')) if cls else case.get('name')


def _full_message(attr, text):
  """pytest cuts long failure messages in the attribute and points to the
  element text, which holds the whole report; rebuild the whole message."""
  if 'full report in element text]' not in attr:
    return attr or text
  start = text.find(attr.splitlines()[0])
  return text[start:] if start >= 0 else attr + '\n' + text


def read_junit(path):
  """Returns a list of (name, outcome, message) for every test case."""
  cases = []
  for case in ET.parse(path).getroot().iter('testcase'):
    outcome, message = 'passed', ''
    for tag in ('failure', 'error', 'skipped'):
      child = case.find(tag)
      if child is not None:
        outcome = {'failure': 'failed', 'error': 'error'}.get(tag, tag)
        message = _full_message(child.get('message') or '', child.text or '')
        break
    cases.append((_short_name(case), outcome, message))
  return cases


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument('--total')
  parser.add_argument('--junit')
  parser.add_argument('--events')
  parser.add_argument('--bar', type=int, default=0)
  parser.add_argument('--pytest-exit', type=int, default=None)
  parser.add_argument('--label', default='tests')
  parser.add_argument('--all-must-pass', action='store_true')
  parser.add_argument('--record')
  args = parser.parse_args(argv)
  if args.total:
    return print_total(args.total)
  if not args.junit:
    parser.error('--junit or --total is required')

  problems = []
  try:
    cases = read_junit(args.junit)
  except (OSError, ET.ParseError) as e:
    cases = []
    problems.append('no readable JUnit report (%s)' % e)

  events = {}
  if args.events:
    try:
      with open(args.events, encoding='utf-8') as f:
        events = json.load(f)
    except (OSError, ValueError) as e:
      problems.append('no readable events file from the plugin (%s)' % e)

  counts = {'passed': 0, 'failed': 0, 'skipped': 0, 'error': 0}
  crashes, timeouts = {}, {}
  for name, outcome, message in cases:
    counts[outcome] += 1
    if outcome in ('failed', 'error'):
      if _TIMEOUT_MARK in message:
        timeouts[name] = _first_line(message)
      if _CRASH_MARK in message:
        crashes[name] = _first_line(message)
  for e in events.get('events', []):
    name = e['nodeid'].split('::', 1)[-1]
    (crashes if e['kind'] == 'crash' else timeouts).setdefault(name, e['detail'])

  bad = [(n, o, m) for n, o, m in cases if o in ('failed', 'error')]
  if bad:
    print('Failed tests (%d):' % len(bad))
    for name, outcome, message in bad:
      reason = _reason(message)
      print('  %-6s %s: %s' % (outcome.upper(), name, reason))
  for title, found in (('Runner crashes', crashes), ('Timeouts', timeouts)):
    if found:
      print('%s (%d):' % (title, len(found)))
      for name, detail in sorted(found.items())[:10]:
        print('  %s: %s' % (name, detail))
      if len(found) > 10:
        print('  ... and %d more' % (len(found) - 10))

  collected = events.get('collected')
  if collected is not None and collected != len(cases):
    problems.append(
      'only %d of %d collected tests ran%s'
      % (
        len(cases),
        collected,
        ' (%s)' % events['stop_reason'] if events.get('stop_reason') else '',
      )
    )
  if not cases:
    problems.append('no tests ran')
  if args.pytest_exit not in (None, 0, 1):
    problems.append('pytest exited with status %d' % args.pytest_exit)
  if counts['passed'] < args.bar:
    problems.append('%d passed, below the bar of %d' % (counts['passed'], args.bar))
  if args.all_must_pass and counts['failed'] + counts['error']:
    problems.append('%d failed, %d errors' % (counts['failed'], counts['error']))
  if crashes:
    problems.append('the runner crashed in %d test(s)' % len(crashes))
  if timeouts:
    problems.append('%d test(s) hit the timeout' % len(timeouts))

  if problems:
    print('%s gate FAILED: %s' % (args.label, '; '.join(problems)))
  else:
    print(
      '%s gate OK: %d passed (%s), no crashes, no timeouts'
      % (args.label, counts['passed'], 'none failed' if args.all_must_pass else 'bar %d' % args.bar)
    )
  print(
    '%s: %d passed, %d failed, %d skipped, %d errors'
    % (args.label, counts['passed'], counts['failed'], counts['skipped'], counts['error'])
  )
  if args.record:
    with open(args.record, 'a', encoding='utf-8') as f:
      f.write(json.dumps(dict(counts, label=args.label)) + '\n')
  return 1 if problems else 0


def print_total(path):
  total = {'passed': 0, 'failed': 0, 'skipped': 0, 'error': 0}
  try:
    with open(path, encoding='utf-8') as f:
      for line in f:
        if line.strip():
          record = json.loads(line)
          for key in total:
            total[key] += int(record.get(key, 0))
  except OSError:
    pass
  print(
    'total: %d passed, %d failed, %d skipped'
    % (total['passed'], total['failed'] + total['error'], total['skipped'])
  )
  return 0


if __name__ == '__main__':
  sys.exit(main())
