"""Cross-check refract-translate's bundle descriptors with the Python SDK.

Loads every serialized ProcessBundleDescriptor in a directory (written by
`tests/export_descriptors.rs`) and builds the Python harness's
`BundleProcessor` from it, which decodes every coder, creates every
operation (data sources and sinks with their port coders, ParDos with their
side inputs, state and timers) and wires them together, exactly as a worker
does on its first ProcessBundleRequest. Nothing is executed.

    python3 runner/translate/tests/data/check_descriptors.py /tmp/pbds
"""

import glob
import os
import sys

from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.worker import bundle_processor
from apache_beam.runners.worker import data_plane


def main(directory):
  failures = 0
  paths = sorted(glob.glob(os.path.join(directory, '*.pb')))
  for path in paths:
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor()
    with open(path, 'rb') as f:
      descriptor.ParseFromString(f.read())
    try:
      # No state handler: side inputs and user state are only read when
      # elements arrive.
      processor = bundle_processor.BundleProcessor(
        frozenset(),
        descriptor,
        None,
        data_plane.InMemoryDataChannelFactory(data_plane.InMemoryDataChannel()),
      )
      ops = len(processor.ops)
      print('ok   %s (%d operations)' % (os.path.basename(path), ops))
    except Exception as e:  # pylint: disable=broad-except
      failures += 1
      print('FAIL %s: %r' % (os.path.basename(path), e))
  print('%d descriptors, %d failures' % (len(paths), failures))
  return 1 if failures else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1]))
