"""Whether a store URL can be opened here, asked before anything is written: the recipe's door (`store:`) and the
store itself (`--store` of every command) ask the same question, so `regimen check` refuses what a run would."""

from __future__ import annotations


def store_url_problem(url: str) -> str | None:
    """What is wrong with `url` as a store (a folder or an fsspec URL), or None. An empty URL would be the current
    folder; a protocol fsspec does not know, or whose package is not installed, would fail at the first write.
    fsspec's own registry answers (`get_filesystem_class`), so every protocol it knows stays usable."""
    import fsspec

    if not str(url).strip():
        return "empty: give a folder or a URL such as s3://bucket/regimen"
    protocol, _ = fsspec.core.split_protocol(str(url))
    if protocol is None or protocol == "file":
        return None
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        said = (str(exc).strip().splitlines() or [""])[0]
        return f"the {protocol}:// protocol needs a package that is not installed ({said})"
    except ValueError:
        return f"no filesystem for {protocol}:// (a protocol fsspec does not know)"
    return None
