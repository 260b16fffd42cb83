package org.refract.beam;

import java.util.Collections;
import org.apache.beam.runners.portability.PortableRunner;
import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.PipelineResult;
import org.apache.beam.sdk.PipelineRunner;
import org.apache.beam.sdk.options.PipelineOptions;

/**
 * Runs a pipeline on Refract, a portable Beam runner, started for this JVM: {@code
 * --runner=RefractRunner}. The first pipeline starts {@code refract serve} on free ports (see
 * {@link RefractServer} for which binary) and prints its web UI's address; later pipelines of the
 * JVM reuse it. Submission goes through Beam's {@link PortableRunner} (its result waits on the
 * job's state stream, see {@link PromptPipelineResult}); the SDK workers are LOOPBACK
 * (threads of this JVM, which run bundles in parallel) unless {@code --defaultEnvironmentType}
 * says otherwise. To submit to a server already running, use {@code --runner=PortableRunner
 * --jobEndpoint=HOST:PORT}.
 */
public class RefractRunner extends PipelineRunner<PipelineResult> {
  private final RefractPipelineOptions options;

  private RefractRunner(RefractPipelineOptions options) {
    this.options = options;
  }

  /** Called by {@link Pipeline#run} for {@code --runner=RefractRunner}. */
  public static RefractRunner fromOptions(PipelineOptions options) {
    RefractPipelineOptions refract = options.as(RefractPipelineOptions.class);
    String endpoint = refract.getJobEndpoint();
    if (endpoint != null && !endpoint.isEmpty()) {
      throw new IllegalArgumentException(
          "--jobEndpoint names a running server: use --runner=PortableRunner with it; "
              + "RefractRunner starts its own");
    }
    String environment = refract.getDefaultEnvironmentType();
    if (environment == null || environment.isEmpty()) {
      refract.setDefaultEnvironmentType("LOOPBACK");
    }
    // LOOPBACK workers run in this JVM, on its classpath: staging the classpath (which Beam's
    // PortableRunner does by default, hashing every jar on every run) would serve nobody.
    if ("LOOPBACK".equals(refract.getDefaultEnvironmentType())
        && refract.getFilesToStage() == null) {
      refract.setFilesToStage(Collections.emptyList());
    }
    return new RefractRunner(refract);
  }

  @Override
  public PipelineResult run(Pipeline pipeline) {
    String endpoint = RefractServer.endpoint(options);
    options.setJobEndpoint(endpoint);
    return new PromptPipelineResult(PortableRunner.fromOptions(options).run(pipeline), endpoint);
  }
}
