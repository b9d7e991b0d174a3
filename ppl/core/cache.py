"""JAX's persistent compilation cache: compiled programs kept on disk between processes.

On the small problems people start with, most of a fit's wait is XLA compiling its programs, and a
second process fitting the same model to data of the same shapes compiles the same programs again.
With the cache on, JAX stores each compiled program in a folder, keyed by the program's text, the
compiler options, JAX's version and the device, and the next process loads it instead of compiling.
A program that changes (other shapes, another JAX) has another key, so a stale entry is never used;
it is only left for the size bound to evict.

A compiled program loaded from the cache runs as machine code, so the folder must be one that only
this user can write to: it is created private, and a folder that other users may write to is refused.
"""

from __future__ import annotations

import ctypes
import gc
import os
import stat
from pathlib import Path

from ppl.core.errors import OptionError

__all__ = ["use_compilation_cache", "default_cache_dir", "release_compiled", "CACHE_ENV", "DEFAULT_MAX_BYTES"]

CACHE_ENV = "PPL_COMPILATION_CACHE"  # a folder for the cache, or "off"
DEFAULT_MAX_BYTES = 2 * 1024**3  # least recently used programs are evicted beyond this
_OFF = {"off", "0", "no", "false", "none"}


def default_cache_dir() -> Path:
    """The user's cache folder for ppl's compiled programs: ``$XDG_CACHE_HOME/ppl/jax`` or ``~/.cache/ppl/jax``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ppl" / "jax"


def use_compilation_cache(path: str | os.PathLike | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Path | None:
    """Keep JAX's compiled programs in ``path`` so that later processes load them instead of compiling.

    Call it once, before the first fit; the ``ppl`` command line calls it itself (``--no-cache`` turns
    it off). ``path`` defaults to ``$PPL_COMPILATION_CACHE`` when that is set (``off`` turns the cache
    off) and to :func:`default_cache_dir` otherwise. A cache that JAX already has configured (by
    ``jax.config.update("jax_compilation_cache_dir", ...)`` or ``JAX_COMPILATION_CACHE_DIR``) is left
    exactly as it is. The folder holds at most ``max_bytes``; least recently used programs go first.

    Returns the folder in use, or ``None`` when the cache is off.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1024**2:
        raise OptionError(f"use_compilation_cache: max_bytes must be a whole number of bytes, at least 1 MiB "
                          f"(got {max_bytes!r})")
    # Imported here, not above: the command line imports this module for its listing commands, which
    # must answer without loading JAX.
    import jax

    configured = jax.config.jax_compilation_cache_dir
    if configured:
        return Path(configured)
    if path is None:
        chosen = os.environ.get(CACHE_ENV, "").strip()
        if chosen.lower() in _OFF:
            return None
        path = chosen or default_cache_dir()
        where = f"{CACHE_ENV}={chosen}" if chosen else "the default cache folder"
    else:
        where = "use_compilation_cache(path)"
    folder = _private_folder(Path(path).expanduser(), where)
    jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
    # Every program is kept: on 2 cores even a tenth-of-a-second compilation is worth loading instead.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    return folder


def release_compiled() -> None:
    """Drop the compiled programs JAX holds in memory and hand the freed memory back to the system.

    For a process that runs one fit after another whose programs serve no later one (``ppl.compare``):
    each method compiles its own steps, and held, they added up. ``jax.clear_caches`` frees them, but
    glibc's allocator keeps freed blocks in its arenas, so the process's resident memory did not fall
    (the main job: 1.18 GB after the last fit with the caches cleared after every fit; 0.46 GB with the
    arenas trimmed too). Programs needed again are loaded from the persistent cache when it is on.
    Every JAX program of the process is dropped, the caller's own ``jax.jit`` functions included: they
    compile again on their next call.
    """
    import jax

    jax.clear_caches()
    gc.collect()
    _trim_heap()


def _trim_heap() -> None:
    """Return the C heap's free memory to the system (glibc's ``malloc_trim``; a no-op elsewhere)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the symbols the process has loaded, libc's among them
    except (OSError, AttributeError, TypeError):  # musl, macOS, Windows: no malloc_trim
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)


def _private_folder(folder: Path, where: str) -> Path:
    """``folder``, created with permissions for this user only; refused if other users may write to it."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError as error:
        raise OptionError(f"compilation cache ({where}): cannot create or read {folder}: {error.strerror}; "
                          f"name a folder you can write to, or set {CACHE_ENV}=off") from None
    if not stat.S_ISDIR(info.st_mode):
        raise OptionError(f"compilation cache ({where}): {folder} is not a folder; name a folder, "
                          f"or set {CACHE_ENV}=off")
    if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        raise OptionError(f"compilation cache ({where}): {folder} is not private to you (owner uid {info.st_uid}, "
                          f"mode {stat.filemode(info.st_mode)}); programs loaded from it run as code, so it must be "
                          f"yours and writable by you alone: `chmod go-w {folder}`, name another folder, "
                          f"or set {CACHE_ENV}=off")
    if not os.access(folder, os.W_OK):
        raise OptionError(f"compilation cache ({where}): {folder} is not writable; name a folder you can write to, "
                          f"or set {CACHE_ENV}=off")
    return folder
