package org.refract.beam;

import java.util.List;
import org.apache.beam.sdk.PipelineRunner;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsRegistrar;
import org.apache.beam.sdk.runners.PipelineRunnerRegistrar;

/**
 * Makes {@code --runner=RefractRunner} and {@code --runner=TestRefractRunner} resolve by name, and
 * {@code --refractLocation} parse, for any pipeline with this jar on its classpath (registered in
 * {@code META-INF/services}).
 */
public final class RefractRunnerRegistrar {
  private RefractRunnerRegistrar() {}

  /** The runners. */
  public static final class Runners implements PipelineRunnerRegistrar {
    @Override
    public Iterable<Class<? extends PipelineRunner<?>>> getPipelineRunners() {
      return List.of(RefractRunner.class, TestRefractRunner.class);
    }
  }

  /** Their options. */
  public static final class Options implements PipelineOptionsRegistrar {
    @Override
    public Iterable<Class<? extends PipelineOptions>> getPipelineOptions() {
      return List.of(RefractPipelineOptions.class);
    }
  }
}
