"""Builder images and builds inside them: builder.py (image.build/list/prune, QEMU emulation, which image has which
Python), bases.py (debootstrap bases), container.py (a build in a container, its outputs taken back as untrusted),
cli.py (`invoke image.*`). The Docker client itself is apexkit/dockerclient.py."""
