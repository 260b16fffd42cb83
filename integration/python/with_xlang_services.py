"""Runs a command with a Java expansion service and a Kafka broker up.

    python with_xlang_services.py LOG_DIR -- COMMAND [ARG...]

starts Beam Java's expansion service (KafkaIO; xlang_services.py) and a
one-node Kafka broker, runs COMMAND with EXPANSION_PORT and
KAFKA_BOOTSTRAP_SERVER set as Beam's `xlang_kafkaio_it_test.py` reads them,
stops both, and exits with COMMAND's status. Logs go to LOG_DIR.
"""

import os
import subprocess
import sys

import xlang_services


def main(argv):
  if len(argv) < 4 or argv[2] != '--':
    sys.exit('usage: with_xlang_services.py LOG_DIR -- COMMAND [ARG...]')
  log_dir, command = argv[1], argv[3:]
  os.makedirs(log_dir, exist_ok=True)
  with (
    xlang_services.java_expansion_service(log_dir) as expansion,
    xlang_services.kafka_broker(log_dir) as bootstrap,
  ):
    env = dict(
      os.environ, EXPANSION_PORT=expansion.rsplit(':', 1)[1], KAFKA_BOOTSTRAP_SERVER=bootstrap
    )
    return subprocess.run(command, env=env, check=False).returncode


if __name__ == '__main__':
  sys.exit(main(sys.argv))
