"""Prints, as JSON, what a job service says of one job: its state, its
messages, or a committed user counter.

For tests whose job service is on another (virtual) host: run there as a
process of its own (netns_hosts' `Host.run`). A gRPC call made from a
thread of the test's process that joined the host's namespace is not
enough: gRPC may connect from its own threads, which stay in the test's
namespace.

  python job_probe.py ENDPOINT JOB_ID state
  python job_probe.py ENDPOINT JOB_ID messages
  python job_probe.py ENDPOINT JOB_ID counter NAME
"""

import json
import sys

from refract_testlib import committed_counter, job_messages, job_state


def main():
  if len(sys.argv) < 4 or sys.argv[3] not in ('state', 'messages', 'counter'):
    sys.exit(__doc__)
  endpoint, job, what = sys.argv[1:4]
  if what == 'state':
    value = job_state(endpoint, job)
  elif what == 'messages':
    value = job_messages(endpoint, job)
  else:
    if len(sys.argv) != 5:
      sys.exit(__doc__)
    value = committed_counter(endpoint, job, sys.argv[4])
  print(json.dumps(value))


if __name__ == '__main__':
  main()
