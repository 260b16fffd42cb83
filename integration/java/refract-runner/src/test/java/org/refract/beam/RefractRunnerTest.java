package org.refract.beam;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.Serializable;
import java.util.HashSet;
import java.util.Set;
import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.coders.AtomicCoder;
import org.apache.beam.sdk.coders.StringUtf8Coder;
import org.apache.beam.sdk.options.ExperimentalOptions;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PortablePipelineOptions;
import org.apache.beam.sdk.testing.PAssert;
import org.apache.beam.sdk.testing.TestPipeline;
import org.apache.beam.sdk.transforms.Create;
import org.apache.beam.sdk.transforms.DoFn;
import org.apache.beam.sdk.transforms.ParDo;
import org.apache.beam.sdk.transforms.MapElements;
import org.apache.beam.sdk.transforms.Sum;
import org.apache.beam.sdk.values.KV;
import org.apache.beam.sdk.values.PCollection;
import org.apache.beam.sdk.values.TypeDescriptor;
import org.apache.beam.sdk.values.TypeDescriptors;
import org.junit.Rule;
import org.junit.Test;
import org.junit.runner.RunWith;
import org.junit.runners.JUnit4;

/**
 * The runners as a Beam Java test suite uses them: the options come from {@code
 * -DbeamTestPipelineOptions} (set by this module's surefire configuration to TestRefractRunner),
 * with a real refract binary.
 */
@RunWith(JUnit4.class)
public class RefractRunnerTest {
  @Rule public final transient TestPipeline pipeline = TestPipeline.create();

  @Test
  public void aTestPipelineRunsOnRefract() {
    assertEquals(TestRefractRunner.class, pipeline.getOptions().getRunner());
    PCollection<KV<String, Integer>> sums =
        pipeline
            .apply(Create.of(KV.of("a", 1), KV.of("b", 2), KV.of("a", 3), KV.of("b", 4)))
            .apply(Sum.integersPerKey());
    PAssert.that(sums).containsInAnyOrder(KV.of("a", 4), KV.of("b", 6));
    pipeline.run();
  }

  @Test
  public void pipelinesOfOneJvmShareOneServer() {
    PipelineOptions options = TestPipeline.testingPipelineOptions();
    String first = RefractServer.endpoint(options.as(RefractPipelineOptions.class));
    Pipeline p = Pipeline.create(options);
    PAssert.that(p.apply(Create.of(1, 2, 3))).containsInAnyOrder(1, 2, 3);
    p.run();
    assertEquals(first, RefractServer.endpoint(options.as(RefractPipelineOptions.class)));
  }

  /** Runs {@code p}, which must fail, and returns its failure with every cause, one a line. */
  private static String failureOf(Pipeline p) {
    Throwable failure = assertThrows(Throwable.class, p::run);
    StringBuilder messages = new StringBuilder();
    for (Throwable t = failure; t != null; t = t.getCause()) {
      messages.append(t).append('\n');
    }
    return messages.toString();
  }

  @Test
  public void aFailingDoFnFailsTheTest() {
    Pipeline p = Pipeline.create(TestPipeline.testingPipelineOptions());
    p.apply(Create.of(1, 2, 3))
        .apply(
            MapElements.into(TypeDescriptors.integers())
                .via(
                    (Integer x) -> {
                      if (x == 2) {
                        throw new IllegalStateException("two is not allowed here");
                      }
                      return x;
                    }));
    String text = failureOf(p);
    // The job's failure carries the SDK's error text.
    assertTrue(text, text.contains("two is not allowed here"));
  }

  /**
   * Drops elements it has seen before, in its own memory: not idempotent, so an element whose
   * bundle runs again is lost. A runner that runs each bundle once never shows it.
   */
  static class DedupeInMemory extends DoFn<String, String> {
    private transient Set<String> seen;

    @Setup
    public void setup() {
      seen = new HashSet<>();
    }

    @ProcessElement
    public void process(@Element String word, OutputReceiver<String> out) {
      if (seen.add(word)) {
        out.output(word);
      }
    }
  }

  private static void dedupeInMemory(Pipeline p) {
    PAssert.that(p.apply(Create.of("a", "b", "c")).apply(ParDo.of(new DedupeInMemory())))
        .containsInAnyOrder("a", "b", "c");
  }

  @Test
  public void strictModeFailsADoFnThatIsNotIdempotentSayingWhy() {
    PipelineOptions options = TestPipeline.testingPipelineOptions();
    // One worker: the replayed bundle meets the DoFn instance that ran it first (with several,
    // it may run on another worker's instance, whose memory is empty, and pass).
    options.as(PortablePipelineOptions.class).setSdkWorkerParallelism(1);
    Pipeline p = Pipeline.create(options);
    dedupeInMemory(p);
    String text = failureOf(p);
    assertTrue(text, text.contains("Refract's strict mode (seed "));
    assertTrue(text, text.contains("DedupeInMemory"));
  }

  @Test
  public void withoutStrictModeTheSamePipelinePasses() {
    PipelineOptions options = TestPipeline.testingPipelineOptions();
    options.as(RefractPipelineOptions.class).setRefractStrict(false);
    Pipeline p = Pipeline.create(options);
    dedupeInMemory(p);
    p.run();
  }

  /** A word with a label. */
  static class Labelled implements Serializable {
    final String word;
    final String label;

    Labelled(String word, String label) {
      this.word = word;
      this.label = label;
    }
  }

  /** Writes a Labelled's word and forgets its label: a coder that loses data. */
  static class ForgetfulCoder extends AtomicCoder<Labelled> {
    @Override
    public void encode(Labelled value, OutputStream out) throws IOException {
      StringUtf8Coder.of().encode(value.word, out);
    }

    @Override
    public Labelled decode(InputStream in) throws IOException {
      return new Labelled(StringUtf8Coder.of().decode(in), null);
    }
  }

  /**
   * Labels words and reads the labels back, through a coder that forgets them: right only where
   * the two steps are fused and the SDK hands the objects over without encoding them.
   */
  private static void labelsThroughAForgetfulCoder(Pipeline p) {
    PCollection<Labelled> labelled =
        p.apply(Create.of("a", "b"))
            .apply(
                "Label",
                MapElements.into(TypeDescriptor.of(Labelled.class))
                    .via((String word) -> new Labelled(word, "label-" + word)))
            .setCoder(new ForgetfulCoder());
    PCollection<String> labels =
        labelled.apply(
            "ReadLabel",
            MapElements.into(TypeDescriptors.strings())
                .via((Labelled l) -> String.valueOf(l.label)));
    PAssert.that(labels).containsInAnyOrder("label-a", "label-b");
  }

  @Test
  public void strictModeWithCodersEncodesEveryElementSoACoderThatLosesDataFails() {
    PipelineOptions options = TestPipeline.testingPipelineOptions();
    ExperimentalOptions.addExperiment(
        options.as(ExperimentalOptions.class), "refract_strict=coders");
    Pipeline p = Pipeline.create(options);
    labelsThroughAForgetfulCoder(p);
    String text = failureOf(p);
    assertTrue(text, text.contains("label-a"));
    assertTrue(text, text.contains("every element crossed its coder between transforms"));
  }

  @Test
  public void withoutCodersACoderThatLosesDataGoesUnnoticed() {
    // Strict mode without coders, as TestRefractRunner runs tests.
    Pipeline p = Pipeline.create(TestPipeline.testingPipelineOptions());
    labelsThroughAForgetfulCoder(p);
    p.run();
  }
}
