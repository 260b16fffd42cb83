package org.refract.beam;

import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.PipelineResult;
import org.apache.beam.sdk.PipelineRunner;
import org.apache.beam.sdk.options.PipelineOptions;

/**
 * {@link RefractRunner} for test suites: {@code
 * -DbeamTestPipelineOptions='["--runner=TestRefractRunner"]'}. {@code run} waits for the pipeline
 * to end and fails the test unless it ended DONE, with the job's error when it failed.
 */
public class TestRefractRunner extends PipelineRunner<PipelineResult> {
  private final RefractRunner runner;

  private TestRefractRunner(RefractRunner runner) {
    this.runner = runner;
  }

  /** Called by {@link Pipeline#run} for {@code --runner=TestRefractRunner}. */
  public static TestRefractRunner fromOptions(PipelineOptions options) {
    return new TestRefractRunner(RefractRunner.fromOptions(options));
  }

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
