"""Counts the runner cases of the TypeScript SDK's tests, per runner.

    python summarize.py --bar-runner python DIR/refract.json DIR/python.json

Each file is a mocha JSON report (`--reporter json`). Only the cases that
run on a job service are counted: those under "portable runner @ulr" and
those tagged "@xlang"; the others use the SDK's in-process direct runner.
Prints passed/failed/skipped per runner, then every counted case that
failed on the first runner or passed on the --bar-runner and not on the
first. Exits 1 when there is any.
"""

import argparse
import json
import os
import sys


def is_counted(test):
  title = test.get('fullTitle', '')
  return '@ulr' in title or '@xlang' in title


def read_report(path):
  """Returns {full title: 'passed'|'failed'|'skipped'} of counted cases."""
  try:
    with open(path) as report:
      data = json.load(report)
  except (OSError, ValueError) as err:
    print(f'{path}: no mocha report ({err})')
    return {}
  results = {}
  for verdict, key in (('passed', 'passes'), ('failed', 'failures'), ('skipped', 'pending')):
    for test in data.get(key, []):
      if is_counted(test):
        results[test['fullTitle']] = verdict
  return results


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--bar-runner')
  parser.add_argument('reports', nargs='+')
  args = parser.parse_args()

  runners = {os.path.splitext(os.path.basename(p))[0]: read_report(p) for p in args.reports}
  first = next(iter(runners))
  for runner, results in runners.items():
    values = list(results.values())
    print(
      f'{runner:<10} passed {values.count("passed")}, failed '
      f'{values.count("failed")}, skipped {values.count("skipped")}'
    )
  bad = []
  if not runners[first]:
    bad.append(f'{first}: no counted case ran')
  for title, verdict in sorted(runners[first].items()):
    if verdict == 'failed':
      bad.append(f'{first}: failed: {title}')
  if args.bar_runner in runners:
    for title, verdict in sorted(runners[args.bar_runner].items()):
      if verdict == 'passed' and runners[first].get(title) != 'passed':
        bad.append(
          f'passes on {args.bar_runner}, {runners[first].get(title, "not run")} on {first}: {title}'
        )
  for line in bad:
    print(line)
  print(f'{first}: ' + ('below the bar' if bad else 'meets the bar'))
  return 1 if bad else 0


if __name__ == '__main__':
  sys.exit(main())
