package org.refract.examples;

import java.util.Locale;
import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.io.TextIO;
import org.apache.beam.sdk.options.Default;
import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.options.Validation;
import org.apache.beam.sdk.transforms.Count;
import org.apache.beam.sdk.transforms.DoFn;
import org.apache.beam.sdk.transforms.MapElements;
import org.apache.beam.sdk.transforms.ParDo;
import org.apache.beam.sdk.transforms.SimpleFunction;
import org.apache.beam.sdk.values.KV;

/**
 * Counts the words of a text file and writes one {@code word: count} line per distinct word.
 *
 * <p>Refract's smoke test for the Java SDK: it exercises a source (TextIO's splittable read),
 * fused ParDos, a lifted combiner (Count.perElement, a Combine.perKey) and a sink (TextIO's write,
 * whose finalisation uses side inputs and a GroupByKey). Lines are written in one shard so the
 * output of two runners can be compared after sorting.
 */
public final class WordCount {
  private WordCount() {}

  /** The options this pipeline adds to Beam's own. */
  public interface Options extends PipelineOptions {
    @Description("Text file to count the words of")
    @Validation.Required
    String getInput();

    void setInput(String value);

    @Description("Output file (one shard, exactly this name)")
    @Validation.Required
    String getOutput();

    void setOutput(String value);

    @Description("Minimum word length to count")
    @Default.Integer(1)
    int getMinLength();

    void setMinLength(int value);
  }

  /** Splits a line into lower-case words; a word is a run of letters or apostrophes. */
  static final class ExtractWords extends DoFn<String, String> {
    private final int minLength;

    ExtractWords(int minLength) {
      this.minLength = minLength;
    }

    @ProcessElement
    public void processElement(@Element String line, OutputReceiver<String> out) {
      for (String word : line.toLowerCase(Locale.ROOT).split("[^\\p{L}']+")) {
        String trimmed = word.replaceAll("^'+|'+$", "");
        if (trimmed.length() >= minLength) {
          out.output(trimmed);
        }
      }
    }
  }

  /** Formats a count as {@code word: count}. */
  static final class Format extends SimpleFunction<KV<String, Long>, String> {
    @Override
    public String apply(KV<String, Long> wordCount) {
      return wordCount.getKey() + ": " + wordCount.getValue();
    }
  }

  public static void main(String[] args) {
    Options options = PipelineOptionsFactory.fromArgs(args).withValidation().as(Options.class);
    Pipeline pipeline = Pipeline.create(options);
    pipeline
        .apply("Read", TextIO.read().from(options.getInput()))
        .apply("ExtractWords", ParDo.of(new ExtractWords(options.getMinLength())))
        .apply("Count", Count.perElement())
        .apply("Format", MapElements.via(new Format()))
        .apply("Write", TextIO.write().to(options.getOutput()).withoutSharding());
    pipeline.run().waitUntilFinish();
  }
}
