package org.refract.beam;

import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PortablePipelineOptions;

/** Options of {@link RefractRunner}: which {@code refract} binary to start. */
public interface RefractPipelineOptions extends PortablePipelineOptions {
  @Description(
      "The refract binary to start. Default: refract on PATH, else the one the refract-beam "
          + "Python package installed (found with python3, or $REFRACT_PYTHON).")
  String getRefractLocation();

  void setRefractLocation(String location);
}
