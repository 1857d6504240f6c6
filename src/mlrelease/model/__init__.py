"""The parcel ETA model: feature encoding, the two-output estimator, ONNX export, evaluation."""
