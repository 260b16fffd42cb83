"""A multi-stage pipeline of the kind users run: shop events as JSON lines
are read, parsed and filtered, stamped with their event time, summed per
category in ten-minute windows (top three categories per window), summed
per user, joined with a users table to sum spend per country, and the top
five countries written out.

  python events.py --events 'DIR/events-*.jsonl' --users DIR/users.csv \\
      --output DIR/out [pipeline options]

`python events.py --generate DIR --count N` writes the inputs (fixed seed).
Outputs: OUTPUT-categories* (window start, category, amount) and
OUTPUT-countries* (country, amount), sorted by the bench when compared.
"""

import argparse
import json
import os
import random
import sys

import apache_beam as beam
from apache_beam.io import ReadFromText
from apache_beam.io import WriteToText
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import combiners
from apache_beam.transforms import window

USERS = 5000
CATEGORIES = [
  'books',
  'garden',
  'toys',
  'music',
  'tools',
  'games',
  'food',
  'sports',
  'beauty',
  'office',
  'baby',
  'pets',
]
COUNTRIES = ['de', 'fr', 'nl', 'us', 'br', 'in', 'jp', 'ke', 'au', 'ca']
FILES = 4


def generate(directory, count, seed=11):
  """Writes FILES event files and the users table under `directory`."""
  rng = random.Random(seed)
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, 'users.csv'), 'w') as f:
    for u in range(USERS):
      f.write('u%05d,%s\n' % (u, rng.choice(COUNTRIES)))
  outs = [open(os.path.join(directory, 'events-%d.jsonl' % i), 'w') for i in range(FILES)]
  try:
    for n in range(count):
      event = {
        'user': 'u%05d' % min(int(rng.paretovariate(1.2)) - 1, USERS - 1),
        'category': rng.choice(CATEGORIES),
        'ts': 1_700_000_000 + n * 86_400 // max(count, 1),
        'amount': round(rng.uniform(-5, 100), 2),
        'session': '%08x' % rng.getrandbits(32),
      }
      outs[n % FILES].write(json.dumps(event) + '\n')
  finally:
    for f in outs:
      f.close()


def parse_user(line):
  user, country = line.split(',')
  return user, country


def spend_by_country(joined):
  _, grouped = joined
  for country in grouped['country']:
    for spend in grouped['spend']:
      yield country, spend


def window_start(kv, win=beam.DoFn.WindowParam):
  return '%d,%s' % (int(win.start), ','.join('%s:%.2f' % c for c in kv))


def build(p, events, users, output):
  parsed = (
    p
    | 'ReadEvents' >> ReadFromText(events)
    | 'Parse' >> beam.Map(json.loads)
    | 'Refunds' >> beam.Filter(lambda e: e['amount'] > 0)
    | 'EventTime' >> beam.Map(lambda e: window.TimestampedValue(e, e['ts']))
  )
  windowed = parsed | 'TenMinutes' >> beam.WindowInto(window.FixedWindows(600))
  _ = (
    windowed
    | 'ByCategory' >> beam.Map(lambda e: (e['category'], e['amount']))
    | 'SumCategory' >> beam.CombinePerKey(sum)
    | 'TopCategories'
    >> beam.CombineGlobally(combiners.TopCombineFn(3, key=lambda kv: kv[1])).without_defaults()
    | 'FormatCategories' >> beam.Map(window_start)
    | 'WriteCategories' >> WriteToText(output + '-categories')
  )
  spend = (
    parsed
    | 'ByUser' >> beam.Map(lambda e: (e['user'], e['amount']))
    | 'SumUser' >> beam.CombinePerKey(sum)
  )
  countries = p | 'ReadUsers' >> ReadFromText(users) | 'ParseUsers' >> beam.Map(parse_user)
  _ = (
    {'spend': spend, 'country': countries}
    | 'Join' >> beam.CoGroupByKey()
    | 'SpendByCountry' >> beam.FlatMap(spend_by_country)
    | 'SumCountry' >> beam.CombinePerKey(sum)
    | 'TopCountries' >> beam.combiners.Top.Of(5, key=lambda kv: kv[1])
    | 'FormatCountries' >> beam.FlatMap(lambda top: ['%s,%.2f' % kv for kv in top])
    | 'WriteCountries' >> WriteToText(output + '-countries')
  )


def main(argv):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--generate', help='write the inputs into this directory')
  ap.add_argument('--count', type=int, default=300000)
  ap.add_argument('--events')
  ap.add_argument('--users')
  ap.add_argument('--output')
  args, rest = ap.parse_known_args(argv)
  if args.generate:
    generate(args.generate, args.count)
    return
  if not (args.events and args.users and args.output):
    ap.error('--events, --users and --output are required')
  with beam.Pipeline(options=PipelineOptions(rest)) as p:
    build(p, args.events, args.users, args.output)


if __name__ == '__main__':
  main(sys.argv[1:])
