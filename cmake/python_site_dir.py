"""Where `import ferry` goes for an install prefix: run at install time by the
Python that configured the build (cmake/FerryInstall.cmake).

    python3 cmake/python_site_dir.py PREFIX

Prints two lines: the package directory (absolute), then "on sys.path" when this
Python reads it as it stands, else "not on sys.path". The directory is the one of
this interpreter's site directories (sys.path, its user site) that lies at
PREFIX/lib/<python>/<site-packages|dist-packages>, so the package's libferry.so is
PREFIX/lib; else this interpreter's own layout under PREFIX (PYTHONPATH needed).
"""
import os
import site
import sys
import sysconfig


def site_dir(prefix):
    prefix = os.path.realpath(prefix)
    seen = list(sys.path)
    if site.ENABLE_USER_SITE:
        seen.append(site.getusersitepackages())
    seen.extend(getattr(site, "getsitepackages", lambda: [])())
    for entry in seen:
        path = os.path.realpath(entry) if entry else ""
        rel = os.path.relpath(path, prefix) if path.startswith(prefix + os.sep) else ""
        parts = rel.split(os.sep)
        if len(parts) == 3 and parts[0] == "lib" and parts[2] in ("site-packages", "dist-packages"):
            return os.path.join(prefix, rel), True
    own = sysconfig.get_path("purelib", "posix_prefix", vars={"base": prefix, "platbase": prefix})
    return own, False


if __name__ == "__main__":
    where, on_path = site_dir(sys.argv[1])
    print(where)
    print("on sys.path" if on_path else "not on sys.path")
