package org.refract.beam;

import org.apache.beam.sdk.options.Default;
import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PortablePipelineOptions;

/**
 * Options of {@link RefractRunner}: which {@code refract} binary to start; and, under {@link
 * TestRefractRunner}, whether tests run in strict mode.
 */
public interface RefractPipelineOptions extends PortablePipelineOptions {
  @Description(
      "The refract binary to start. Default: refract on PATH, else the one the refract-beam "
          + "Python package installed (found with python3, or $REFRACT_PYTHON).")
  String getRefractLocation();

  void setRefractLocation(String location);

  @Description(
      "Under TestRefractRunner: strict mode, where Refract runs some bundles twice, cuts input "
          + "into small bundles and reorders it, as any runner may, so that a DoFn relying on one "
          + "runner's habits fails its test (--experiments=refract_strict; "
          + "--experiments=refract_strict=coders also makes every element passing between the "
          + "pipeline's transforms cross its coder). Default: true.")
  @Default.Boolean(true)
  Boolean getRefractStrict();

  void setRefractStrict(Boolean strict);
}
