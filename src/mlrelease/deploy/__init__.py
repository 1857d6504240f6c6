"""Kubernetes manifests for mlrelease, rendered from validated values (`mlrelease deploy render|check`)."""
