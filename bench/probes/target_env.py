"""What `apexkit install` needs to know of a target interpreter (apexkit.install.target reads it). Prints one JSON line:

    python "3.11", implementation "cpython", python_tag "cp311", abiflags, soabi, machine "x86_64", system "Linux",
    glibc "2.35" | null, prefix, base_prefix, executable, base_executable (the interpreter a build venv can be made
    from), is_venv, conda (conda-meta/ in the prefix), pip (its version) | null, tags (the wheel tags this interpreter
    installs, best first, from its pip's own packaging) | null, markers (PEP 508 environment),
    torch {version, cxx11_abi 0|1|null, import_error} | null, torch_npu (version) | null, cann (version) | null,
    dists {canonical name: version} (this prefix's own distributions), visible {canonical name: version} (the others
    it imports: a --system-site-packages base's; pip counts them as installed; pip, torch and torch_npu are read off
    both, the prefix's first),
    apex null | {version, apexkit (its local label starts with "ascend"), dist_info (the directory name),
    record [[path, hash], ...], tags [WHEEL Tag lines]},
    paths {scripts (where pip puts scripts), site_dirs [every folder a distribution is found in, realpath]}.

`--versions-only`: torch is not imported (cxx11_abi null): the check after an install needs only versions.

Standard library only (and the interpreter's own pip for the tags); never imports apexkit. apexkit runs it with
TORCH_DEVICE_BACKEND_AUTOLOAD=0, so `import torch` does not pull torch_npu (which needs CANN's libraries) in; a torch
that still does not import leaves cxx11_abi null with the reason in import_error.
"""

import contextlib
import json
import os
import platform
import re
import sys

RECORD_ROWS = 5000  # an apex wheel has a few hundred files
CANN_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")  # as bench/targetenv.py
CANN_HOMES = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")


def _glibc():
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        text = ""
    if text.startswith("glibc "):
        return text.split()[1]
    lib, version = platform.libc_ver()
    return version if lib == "glibc" and version else None


def _canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _dists():
    """(this prefix's own distributions, the others this interpreter imports: a --system-site-packages base's),
    by canonical name; the first on sys.path wins, as for an import."""
    from importlib import metadata

    prefix = os.path.realpath(sys.prefix) + os.sep
    own, visible = {}, {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        key = _canonical(name)
        if key in own or key in visible:
            continue
        path = os.path.realpath(str(dist.locate_file(""))) + os.sep
        (own if path.startswith(prefix) else visible)[key] = dist
    return own, visible


def _apex(dist):
    if dist is None:
        return None
    version = dist.version
    local = version.split("+", 1)[1] if "+" in version else ""
    record = []
    for line in (dist.read_text("RECORD") or "").splitlines()[:RECORD_ROWS]:
        parts = line.rsplit(",", 2)
        if len(parts) == 3:
            record.append([parts[0], parts[1]])
    tags = [
        line.split(":", 1)[1].strip()
        for line in (dist.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag:")
    ]
    path = getattr(dist, "_path", None)
    return {
        "version": version,
        "apexkit": bool(re.match(r"(ascend|cu[0-9]+\.torch)", local.lower())),
        "dist_info": os.path.basename(str(path)) if path is not None else None,
        "record": record,
        "tags": tags,
    }


def _paths(dists):
    """Where pip writes (the scripts folder) and every folder a distribution is found in (the site directories)."""
    import sysconfig

    paths = sysconfig.get_paths()
    found = {os.path.realpath(paths[k]) for k in ("purelib", "platlib")}
    found |= {os.path.realpath(str(d.locate_file(""))) for d in dists}
    return {"scripts": os.path.realpath(paths["scripts"]), "site_dirs": sorted(found)}


def _torch_cuda(dist):
    """torch.version.cuda ("13.0", or None for a CPU build), read off torch/version.py without importing torch."""
    try:
        with open(str(dist.locate_file("torch/version.py")), "rb") as fh:
            text = fh.read(65536).decode("utf-8", "replace")
    except OSError:
        return None
    found = re.search(r"^cuda(?:\s*:[^=\n]*)?\s*=\s*['\"]([0-9]{1,3}\.[0-9]{1,3})", text, re.M)
    return found.group(1) if found else None


def _torch(dists, load):
    if "torch" not in dists:
        return None
    out = {
        "version": dists["torch"].version,
        "cxx11_abi": None,
        "import_error": None,
        "cuda": _torch_cuda(dists["torch"]),
    }
    if not load:
        return out
    try:
        import torch

        abi = getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None)
        out["cxx11_abi"] = None if abi is None else int(bool(abi))
    except Exception as exc:  # a broken torch: the version is still known, the ABI is not
        out["import_error"] = "%s: %s" % (type(exc).__name__, (str(exc).splitlines() or [""])[0])
    return out


def _cann():
    home = next(
        (os.environ[k] for k in CANN_VARIABLES if os.path.isdir(os.environ.get(k) or "")), None
    )
    home = home or next((d for d in CANN_HOMES if os.path.isdir(d)), None)
    if not home:
        return None
    # as `invoke doctor` reads it: <= 8.3 <arch>-linux/ascend_toolkit_install.info, 8.5+ beside set_env.sh
    infos = []
    with contextlib.suppress(OSError):
        infos = sorted(
            os.path.join(home, d, "ascend_toolkit_install.info")
            for d in os.listdir(home)
            if d.endswith("-linux")
        )
    for info in [*infos, os.path.join(home, "ascend_toolkit_install.info")]:
        try:
            with open(info, errors="replace") as fh:
                text = fh.read(65536)
        except OSError:
            continue
        m = re.search(r"^version=(\S+)", text, re.M)
        if m:
            return m.group(1)[:64]
    return None


def _tags():
    try:
        from pip._vendor.packaging import tags
    except Exception:
        return None
    return [str(t) for t in tags.sys_tags()]


def _markers():
    impl = sys.implementation
    version = "%d.%d.%d" % impl.version[:3]
    return {
        "implementation_name": impl.name,
        "implementation_version": version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": "%d.%d" % sys.version_info[:2],
        "sys_platform": sys.platform,
    }


def _base_executable():
    name = "python%d.%d" % sys.version_info[:2]
    for candidate in (
        getattr(sys, "_base_executable", None),
        os.path.join(sys.base_prefix, "bin", name),
        os.path.join(sys.base_prefix, "bin", "python3"),
    ):
        if (
            candidate
            and os.path.isfile(candidate)
            and not candidate.startswith(sys.prefix + os.sep)
        ):
            return candidate
    return None


def _site_off():
    """Run with -S (apexkit does): what site.py would set, set without running anything of the venv -- no .pth line
    that imports, no sitecustomize -- so a package just installed runs no code before apexkit's verdict on it: the
    venv's prefix (by its pyvenv.cfg, as site.venv), its site directories and the folders their .pth files name."""
    if not sys.flags.no_site:
        return
    import site

    bin_dir = os.path.dirname(os.path.abspath(sys.executable))
    home = os.path.dirname(bin_dir)
    prefixes = [sys.prefix]
    for conf in (os.path.join(bin_dir, "pyvenv.cfg"), os.path.join(home, "pyvenv.cfg")):
        if os.path.isfile(conf):
            with open(conf, errors="replace") as fh:
                system = re.search(
                    r"^\s*include-system-site-packages\s*=\s*true\s*$", fh.read(), re.M | re.I
                )
            sys.prefix = sys.exec_prefix = home
            prefixes = [home, *([sys.base_prefix] if system else [])]
            break
    for folder in site.getsitepackages(prefixes):
        if os.path.isdir(folder) and folder not in sys.path:
            sys.path.append(folder)
            for line in _pth_lines(folder):
                path = os.path.join(folder, line)
                if os.path.isdir(path) and path not in sys.path:
                    sys.path.append(path)


def _pth_lines(folder):
    """The folder lines of the .pth files in `folder` (site.addpackage's; its `import` lines are not run)."""
    lines = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".pth") and not name.startswith("."):
            with contextlib.suppress(OSError), open(
                os.path.join(folder, name), errors="replace"
            ) as fh:
                lines += [
                    x.rstrip()
                    for x in fh
                    if x.strip() and not x.startswith(("#", "import ", "import\t"))
                ]
    return lines


def main():
    _site_off()
    dists, visible = _dists()
    seen = {
        **visible,
        **dists,
    }  # what `import` and pip find: a --system-site-packages base's torch counts
    major, minor = sys.version_info[:2]
    impl = sys.implementation.name
    out = {
        "python": "%d.%d" % (major, minor),
        "implementation": impl,
        "python_tag": ("cp" if impl == "cpython" else impl[:2]) + "%d%d" % (major, minor),
        "abiflags": getattr(sys, "abiflags", ""),
        "soabi": __import__("sysconfig").get_config_var("SOABI"),
        "machine": platform.machine(),
        "system": platform.system(),
        "glibc": _glibc(),
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "executable": sys.executable,
        "base_executable": _base_executable(),
        "is_venv": sys.prefix != sys.base_prefix,
        "conda": os.path.isdir(os.path.join(sys.prefix, "conda-meta")),
        "pip": seen["pip"].version if "pip" in seen else None,
        "tags": _tags(),
        "markers": _markers(),
        "torch": _torch(seen, "--versions-only" not in sys.argv[1:]),
        "torch_npu": seen["torch-npu"].version if "torch-npu" in seen else None,
        "cann": _cann(),
        "dists": {name: dist.version for name, dist in dists.items()},
        "visible": {name: dist.version for name, dist in visible.items()},
        "apex": _apex(dists.get("apex")),
        "paths": _paths(seen.values()),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
