"""patchkit: apply, build and prove llama-server changes on real llama.cpp trees."""
__version__ = "0.1.0"


def data_dir(*parts: str):
    """A top-level data folder (patches/, fixtures/): next to the package in a checkout or an
    editable install, under <prefix>/share/patchkit in a regular install."""
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent.joinpath(*parts)
    if here.exists():
        return here
    return Path(sys.prefix, "share", "patchkit", *parts)
