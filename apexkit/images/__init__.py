"""Builder images and builds inside them: builder.py (image.build/list/prune, emulation, the Docker client),
base.py (debootstrap bases), container.py (a build in a container, its outputs taken back as untrusted),
cli.py (`invoke image.*`)."""
