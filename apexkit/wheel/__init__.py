"""One wheel: options, interpreters, sources and patches, venvs (uv or virtualenv + pip), compile, binary checks,
SBOM/provenance, the wheel cache and dist/<target> (builder.py runs the steps in order). It knows nothing of
containers, indexes or clusters: those call it."""
