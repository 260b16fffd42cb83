"""Counts the results of Go test binaries run with -test.v, per runner.

    python summarize.py --bar-runner prism DIR/refract DIR/prism [DIR/...]

Each DIR holds one `<package>.log` per test binary (the output of
`<package>.test -test.v ...`). A test is counted by its top-level line
(`--- PASS: TestX`, `--- FAIL:`, `--- SKIP:`); subtests are part of their
parent. A binary that hit its -test.timeout is reported with the test that
was running as `hung`; one that died without a verdict line (a panic in
pipeline code kills the whole binary) counts its running test as failed.

Prints one table row per runner and package, then what keeps the first
directory (the runner under test) below the bar, and exits 1 if anything
does: a test that hung there; a test that passed on the --bar-runner
directory and did not pass there; without a bar runner, any failure. A test
named in --expected-failures (lines `package.Test reason`) may fail.
"""

import argparse
import os
import re
import sys

VERDICT = re.compile(r'^--- (PASS|FAIL|SKIP): (\S+)')
RUN = re.compile(r'^=== RUN\s+(\S+)$')
TIMED_OUT = re.compile(r'^panic: test timed out after')
RUNNING = re.compile(r'^\s+(Test\S+) \(')


def read_log(path):
  """Returns {test: 'PASS'|'FAIL'|'SKIP'|'HUNG'} for one binary's log."""
  results = {}
  last_started = None
  timed_out = False
  with open(path, errors='replace') as log:
    for line in log:
      line = line.rstrip('\n')
      verdict = VERDICT.match(line)
      if verdict:
        results[verdict.group(2)] = verdict.group(1)
        continue
      started = RUN.match(line)
      if started and '/' not in started.group(1):
        last_started = started.group(1)
        continue
      if TIMED_OUT.match(line):
        timed_out = True
        continue
      running = RUNNING.match(line)
      if timed_out and running and '/' not in running.group(1):
        results[running.group(1)] = 'HUNG'
  if last_started and last_started not in results:
    results[last_started] = 'HUNG' if timed_out else 'FAIL'
  return results


def read_runner(directory):
  """Returns {package: {test: verdict}} for one runner's directory."""
  packages = {}
  for name in sorted(os.listdir(directory)):
    if name.endswith('.log'):
      packages[name[: -len('.log')]] = read_log(os.path.join(directory, name))
  return packages


def counts(results):
  """Returns (passed, failed, skipped, hung) over {test: verdict}."""
  verdicts = list(results.values())
  return tuple(verdicts.count(v) for v in ('PASS', 'FAIL', 'SKIP', 'HUNG'))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument(
    '--bar-runner', help='directory name whose passes the first directory must match'
  )
  parser.add_argument('--expected-failures', help='file of `package.Test reason` lines')
  parser.add_argument('dirs', nargs='+')
  args = parser.parse_args()
  expected = {}
  if args.expected_failures:
    with open(args.expected_failures) as f:
      for line in f:
        line = line.strip()
        if line and not line.startswith('#'):
          name, _, reason = line.partition(' ')
          expected[name] = reason.strip()

  runners = {os.path.basename(d.rstrip('/')): read_runner(d) for d in args.dirs}
  first = os.path.basename(args.dirs[0].rstrip('/'))
  print(f"{'runner':<18} {'package':<12} {'passed':>6} {'failed':>6} {'skipped':>7} {'hung':>4}")
  for runner, packages in runners.items():
    totals = [0, 0, 0, 0]
    for package, results in packages.items():
      row = counts(results)
      totals = [a + b for a, b in zip(totals, row, strict=True)]
      print(f'{runner:<18} {package:<12} {row[0]:>6} {row[1]:>6} {row[2]:>7} {row[3]:>4}')
    print(f'{runner:<18} {"total":<12} {totals[0]:>6} {totals[1]:>6} {totals[2]:>7} {totals[3]:>4}')

  bad = []
  has_bar = bool(args.bar_runner and args.bar_runner in runners)
  for package, results in runners[first].items():
    for test, verdict in sorted(results.items()):
      name = f'{package}.{test}'
      if verdict == 'FAIL' and name in expected:
        print(f'{first}: {name} fails, as expected: {expected[name]}')
      elif verdict == 'HUNG' or (verdict == 'FAIL' and not has_bar):
        bad.append(f'{first}: {name} {verdict.lower()}')
  if has_bar:
    for package, results in runners[args.bar_runner].items():
      ours = runners[first].get(package, {})
      for test, verdict in sorted(results.items()):
        if verdict == 'PASS' and ours.get(test) != 'PASS' and f'{package}.{test}' not in expected:
          bad.append(
            f'{package}.{test}: passes on {args.bar_runner}, '
            f'{ours.get(test, "not run").lower()} on {first}'
          )
  for line in bad:
    print(line)
  print(f'{first}: ' + ('below the bar' if bad else 'meets the bar'))
  return 1 if bad else 0


if __name__ == '__main__':
  sys.exit(main())
