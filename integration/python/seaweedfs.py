"""A SeaweedFS server for tests: an S3-compatible object store on loopback
ports, with one identity (an access key and a secret) and one bucket.

The binary is built by integration/seaweedfs/build-seaweedfs.sh (once, then
cached), or named by $REFRACT_WEED.
"""

import json
import os
import time
import urllib.request

from refract_testlib import RefractProcess, built_binary, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(os.path.dirname(HERE), 'seaweedfs', 'build-seaweedfs.sh')
ACCESS_KEY = 'refracttestkey'
SECRET_KEY = 'refracttestsecret0123456789'


def weed_binary():
  return built_binary('REFRACT_WEED', BUILD)


class SeaweedS3:
  """`weed server` with its master, volume, filer and S3 gateway on free
  loopback ports, data under `root`; `start` waits until `bucket` exists
  and the S3 port answers.

  On a virtual host (netns_hosts), `host` is where it runs (on the host's
  address) and `client` the host its readiness is checked from."""

  def __init__(self, root, bucket='refract', host=None, client=None):
    self.root = root
    self.bucket = bucket
    self.ports = {name: free_port() for name in ('master', 'volume', 'filer', 's3')}
    self.process = None
    self.host = host
    self.client = client
    self.ip = host.address if host is not None else '127.0.0.1'

  @property
  def endpoint(self):
    return 'http://%s:%d' % (self.ip, self.ports['s3'])

  def env(self):
    """The environment a Refract server reaches the bucket with."""
    return {
      'AWS_ACCESS_KEY_ID': ACCESS_KEY,
      'AWS_SECRET_ACCESS_KEY': SECRET_KEY,
      'AWS_REGION': 'us-east-1',
      'AWS_ENDPOINT_URL': self.endpoint,
    }

  def start(self, timeout_s=60):
    data = self.root / 'data'
    data.mkdir(parents=True, exist_ok=True)
    config = self.root / 's3.json'
    identity = {
      'name': 'refract',
      'credentials': [{'accessKey': ACCESS_KEY, 'secretKey': SECRET_KEY}],
      'actions': ['Admin', 'Read', 'Write', 'List', 'Tagging'],
    }
    config.write_text(json.dumps({'identities': [identity]}))
    p = self.ports
    grpc = {name: free_port() for name in p}
    argv = [
      weed_binary(),
      'server',
      '-dir=%s' % data,
      '-ip=%s' % self.ip,
      '-ip.bind=%s' % self.ip,
      '-master.port=%d' % p['master'],
      '-master.port.grpc=%d' % grpc['master'],
      '-volume.port=%d' % p['volume'],
      '-volume.port.grpc=%d' % grpc['volume'],
      '-volume.max=4',
      '-filer',
      '-filer.port=%d' % p['filer'],
      '-filer.port.grpc=%d' % grpc['filer'],
      '-s3',
      '-s3.port=%d' % p['s3'],
      '-s3.port.grpc=%d' % grpc['s3'],
      '-s3.port.iceberg=0',
      '-s3.port.lance=0',
      '-s3.config=%s' % config,
    ]
    if self.host is None:
      self.process = RefractProcess(argv, self.root / 'weed.log')
      running = self.process.proc
    else:
      running = self.host.popen(argv, log=self.root / 'weed.log')
    deadline = time.monotonic() + timeout_s
    while True:
      try:
        if self._reached(self._make_bucket) is None and self._reached(self._s3_answers):
          return self
      except OSError:
        pass
      if time.monotonic() > deadline or running.poll() is not None:
        raise AssertionError('SeaweedFS did not start:\n' + self.log_tail())
      time.sleep(0.5)

  def _reached(self, fn):
    """fn(), from where the store is reached."""
    return fn() if self.client is None else self.client.in_namespace(fn)

  def _make_bucket(self):
    # A bucket is a directory under the filer's /buckets.
    url = 'http://%s:%d/buckets/%s/?op=mkdir' % (self.ip, self.ports['filer'], self.bucket)
    try:
      with urllib.request.urlopen(urllib.request.Request(url, method='POST'), timeout=5):
        pass
    except urllib.error.HTTPError as e:
      if e.code != 409:  # 409: it exists already
        raise

  def _s3_answers(self):
    try:
      urllib.request.urlopen(self.endpoint + '/' + self.bucket, timeout=5)
    except urllib.error.HTTPError as e:
      # Unsigned requests are refused: the gateway is up, with auth on.
      return e.code == 403
    return True

  def objects(self, prefix):
    """The names of the objects under `prefix` in the bucket (through the
    filer, which lists directories)."""
    url = 'http://%s:%d/buckets/%s/%s/?limit=10000' % (
      self.ip,
      self.ports['filer'],
      self.bucket,
      prefix.strip('/'),
    )
    request = urllib.request.Request(url, headers={'Accept': 'application/json'})

    def listing():
      try:
        with urllib.request.urlopen(request, timeout=10) as response:
          return json.load(response)
      except urllib.error.HTTPError as e:
        if e.code == 404:
          return {}
        raise

    found = self._reached(listing)
    return [e['FullPath'].rsplit('/', 1)[-1] for e in found.get('Entries') or []]

  def log_tail(self):
    path = self.root / 'weed.log'
    if not path.exists():
      return ''
    return path.read_text(errors='replace')[-4000:]

  def stop(self):
    if self.process is not None:
      self.process.stop()
