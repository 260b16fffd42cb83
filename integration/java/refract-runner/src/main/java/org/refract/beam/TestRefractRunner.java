package org.refract.beam;

import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.PipelineResult;
import org.apache.beam.sdk.PipelineRunner;
import org.apache.beam.sdk.options.ExperimentalOptions;
import org.apache.beam.sdk.options.PipelineOptions;

/**
 * {@link RefractRunner} for test suites: {@code
 * -DbeamTestPipelineOptions='["--runner=TestRefractRunner"]'}. {@code run} waits for the pipeline
 * to end and fails the test unless it ended DONE, with the job's error when it failed.
 *
 * <p>Tests run in Refract's strict mode ({@code --experiments=refract_strict}) unless {@code
 * --refractStrict=false}, or the pipeline's own {@code --experiments=refract_strict=off}: bundles
 * run twice, are cut small and reordered, as any runner may, so that a DoFn that is not
 * idempotent or relies on bundle boundaries or order fails here, with a note saying what strict
 * mode did. {@code --experiments=refract_strict=coders} also makes every element passing between
 * the pipeline's transforms cross its coder, so that a coder that loses data fails too.
 */
public class TestRefractRunner extends PipelineRunner<PipelineResult> {
  private final RefractRunner runner;

  private TestRefractRunner(RefractRunner runner) {
    this.runner = runner;
  }

  /** Called by {@link Pipeline#run} for {@code --runner=TestRefractRunner}. */
  public static TestRefractRunner fromOptions(PipelineOptions options) {
    if (options.as(RefractPipelineOptions.class).getRefractStrict()) {
      ExperimentalOptions.addExperiment(options.as(ExperimentalOptions.class), STRICT);
    }
    return new TestRefractRunner(RefractRunner.fromOptions(options));
  }

  /** The experiment that turns Refract's strict mode on. */
  static final String STRICT = "refract_strict";

  @Override
  public PipelineResult run(Pipeline pipeline) {
    PipelineResult result = runner.run(pipeline);
    PipelineResult.State state = result.waitUntilFinish();
    if (state != PipelineResult.State.DONE) {
      throw new AssertionError("the pipeline ended " + state + " on Refract, not DONE");
    }
    return result;
  }
}
