package org.refract.beam;

import java.io.IOException;
import java.lang.reflect.Field;
import java.util.Iterator;
import java.util.concurrent.TimeUnit;
import org.apache.beam.model.jobmanagement.v1.JobApi.GetJobStateRequest;
import org.apache.beam.model.jobmanagement.v1.JobApi.JobState;
import org.apache.beam.model.jobmanagement.v1.JobApi.JobStateEvent;
import org.apache.beam.model.jobmanagement.v1.JobServiceGrpc;
import org.apache.beam.sdk.PipelineResult;
import org.apache.beam.sdk.metrics.MetricResults;
import org.apache.beam.vendor.grpc.v1p69p0.com.google.protobuf.ByteString;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.ManagedChannel;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.ManagedChannelBuilder;
import org.joda.time.Duration;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The result of a pipeline {@link RefractRunner} submitted: Beam's {@code PortableRunner} result,
 * whose {@code waitUntilFinish} first follows the job's state stream to its end.
 *
 * <p>Beam Java's portable result polls {@code GetState} every 3 s, so every pipeline, however
 * short, waited about 3 s after it ended: most of a small test's time. The state stream ends at
 * the job's terminal state; after it, the portable result's own first poll finds that state and
 * returns (with its error handling and cleanup). Where the job's id cannot be read from the
 * portable result (another Beam version), it waits as Beam does.
 */
class PromptPipelineResult implements PipelineResult {
  private static final Logger LOG = LoggerFactory.getLogger(PromptPipelineResult.class);

  private final PipelineResult portable;
  private final String endpoint;

  PromptPipelineResult(PipelineResult portable, String endpoint) {
    this.portable = portable;
    this.endpoint = endpoint;
  }

  @Override
  public State getState() {
    return portable.getState();
  }

  @Override
  public State cancel() throws IOException {
    return portable.cancel();
  }

  @Override
  public State waitUntilFinish(Duration duration) {
    return portable.waitUntilFinish(duration);
  }

  @Override
  public State waitUntilFinish() {
    ByteString jobId = jobId(portable);
    if (jobId != null) {
      followToTerminalState(jobId);
    }
    return portable.waitUntilFinish();
  }

  @Override
  public MetricResults metrics() {
    return portable.metrics();
  }

  /** Reads the job's state stream until its end (the terminal state), or until it fails. */
  private void followToTerminalState(ByteString jobId) {
    ManagedChannel channel = ManagedChannelBuilder.forTarget(endpoint).usePlaintext().build();
    try {
      Iterator<JobStateEvent> states =
          JobServiceGrpc.newBlockingStub(channel)
              .getStateStream(GetJobStateRequest.newBuilder().setJobIdBytes(jobId).build());
      while (states.hasNext()) {
        if (isTerminal(states.next().getState())) {
          break;
        }
      }
    } catch (RuntimeException e) {
      // The portable result's own wait still follows, and reports what went wrong.
      LOG.debug("following the job's state stream failed; waiting as Beam does", e);
    } finally {
      channel.shutdownNow();
      try {
        channel.awaitTermination(5, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
  }

  private static boolean isTerminal(JobState.Enum state) {
    switch (state) {
      case DONE:
      case FAILED:
      case CANCELLED:
      case UPDATED:
      case DRAINED:
        return true;
      default:
        return false;
    }
  }

  /** The job id Beam's portable result keeps in a private field, or null. */
  private static ByteString jobId(PipelineResult portable) {
    try {
      Field field = portable.getClass().getDeclaredField("jobId");
      field.setAccessible(true);
      Object value = field.get(portable);
      return value instanceof ByteString ? (ByteString) value : null;
    } catch (ReflectiveOperationException | RuntimeException e) {
      LOG.debug("no job id in {}; waiting as Beam does", portable.getClass(), e);
      return null;
    }
  }
}
