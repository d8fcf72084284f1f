"""Where `import ferry` goes for an install prefix: run at install time by the
Python that configured the build (cmake/FerryInstall.cmake).

    python3 cmake/python_site_dir.py PREFIX
    python3 cmake/python_site_dir.py --reads DIR

With PREFIX, prints three lines: the package directory (absolute), then "on
sys.path" when this Python reads it as it stands, else "not on sys.path", then
this interpreter as "EXECUTABLE VERSION" (the program behind a pyenv shim or a
link). The directory is the one of this interpreter's site directories
(sys.path, its user site) that lies at PREFIX/lib/<python>/<site-packages|
dist-packages>, so the package's libferry.so is PREFIX/lib; else this
interpreter's own layout under PREFIX (PYTHONPATH needed). With --reads DIR,
prints the last two lines for DIR: whether this Python reads it, and who it is.
"""
import os
import platform
import site
import sys
import sysconfig


def seen_dirs():
    seen = list(sys.path)
    if site.ENABLE_USER_SITE:
        seen.append(site.getusersitepackages())
    seen.extend(getattr(site, "getsitepackages", lambda: [])())
    return [os.path.realpath(entry) for entry in seen if entry]


def site_dir(prefix):
    prefix = os.path.realpath(prefix)
    for path in seen_dirs():
        rel = os.path.relpath(path, prefix) if path.startswith(prefix + os.sep) else ""
        parts = rel.split(os.sep)
        if len(parts) == 3 and parts[0] == "lib" and parts[2] in ("site-packages", "dist-packages"):
            return os.path.join(prefix, rel), True
    own = sysconfig.get_path("purelib", "posix_prefix", vars={"base": prefix, "platbase": prefix})
    return own, False


def reads(directory):
    return os.path.realpath(directory) in seen_dirs()


if __name__ == "__main__":
    if sys.argv[1] == "--reads":
        on_path = reads(sys.argv[2])
    else:
        where, on_path = site_dir(sys.argv[1])
        print(where)
    print("on sys.path" if on_path else "not on sys.path")
    print(f"{os.path.realpath(sys.executable)} {platform.python_version()}")
