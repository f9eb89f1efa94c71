"""MACE model files: the shipped default, mace-torch's foundation models by name (where they
are cached), and loading a file safely (models/mace_safe_load.py) into a mace-torch model.
Every failure is a one-line ValueError naming the file and the fix."""
from __future__ import annotations

from pathlib import Path

import torch

DEFAULT_MODEL = Path(__file__).resolve().parent / "data" / "cu_mace_small.model"


def _import_mace():
    """Import mace-torch quietly (it prints a cuequivariance notice and e3nn warns at import)."""
    import contextlib
    import io
    import warnings

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        import mace  # noqa: F401  (must precede torch.load of e3nn objects)
        from mace.modules.models import MACE
    return MACE


def load_mace(path: str | Path, device="cpu", dtype=torch.float64, trust_pickle: bool = False):
    """Load a mace-torch model file; every failure is a one-line ValueError.

    By default through the safe loader (models/mace_safe_load.py: ``weights_only=True`` under
    an allow-list of mace-torch's classes), so a file cannot run code by being opened; a file
    that needs anything else is refused, naming the global.  ``trust_pickle``: unpickle
    freely (``weights_only=False``), which runs any code the file holds: only for files the
    user made or trusts (``model.trust_pickle=true``)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"model.checkpoint={str(path)!r}: no such file; give a mace-torch .model file")
    MACE = _import_mace()
    import warnings

    from .mace_safe_load import RefusedContent, load_safely, torch_supports_safe_load

    if not trust_pickle and not torch_supports_safe_load():
        raise ValueError(f"model.checkpoint={str(path)!r}: the safe model loader needs torch >= 2.6 (this is "
                         f"{torch.__version__}); upgrade torch, or add model.trust_pickle=true for a file you trust")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if trust_pickle:
                model = torch.load(p, map_location=device, weights_only=False)
            else:
                model = load_safely(p, map_location=device)
    except RefusedContent as exc:
        raise ValueError(f"model.checkpoint={str(path)!r} needs a class the safe loader does not allow "
                         f"({exc.what}); it is not a plain mace-torch model. If you made this file yourself "
                         "or trust its source, add model.trust_pickle=true (unpickling runs any code the "
                         "file holds)") from None
    except Exception as exc:  # noqa: BLE001 - pickle errors, zip errors, a TorchScript archive, ...
        if isinstance(exc, RuntimeError) and "TorchScript" in str(exc):
            raise ValueError(f"model.checkpoint={str(path)!r} is a TorchScript archive (such as mace's "
                             "*_compiled.model), not a mace-torch model file; give the .model file") from None
        raise ValueError(f"model.checkpoint={str(path)!r} is not a loadable mace-torch model "
                         f"({type(exc).__name__}); give a file saved by mace-torch") from None
    if not isinstance(model, torch.nn.Module) or not isinstance(model, MACE) or not hasattr(model, "atomic_numbers"):
        raise ValueError(f"model.checkpoint={str(path)!r} holds a {type(model).__name__}, not a MACE model")
    return model.to(device=device, dtype=dtype).eval()


def _foundations():
    """mace-torch's own foundation-model module (its URL tables, cache directory and download)."""
    import contextlib
    import io
    import warnings

    _import_mace()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        from mace.calculators import foundations_models
    return foundations_models


def foundation_models() -> dict[str, tuple[str, str]]:
    """name -> (family, URL) of the foundation models mace-torch knows (its ``mace_mp_urls``
    under their own names, as ``mace_mp(model=...)`` takes them; ``mace_off_urls`` as
    ``off-<size>``, since mace_off's ``small``/``medium``/``large`` clash with MACE-MP's)."""
    fm = _foundations()
    names = {n: ("MACE-MP", u) for n, u in fm.mace_mp_urls.items()}
    names.update({f"off-{n}": ("MACE-OFF", u) for n, u in fm.mace_off_urls.items()})
    return names


def foundation_cache_path(name: str) -> Path:
    """Where mace-torch keeps the downloaded file of foundation model ``name`` (its cache
    directory, ``$XDG_CACHE_HOME/mace`` or ``~/.cache/mace``, under the file name its loaders
    derive from the URL: ``download_mace_mp_checkpoint`` keeps letters, digits and ``_`` of the
    URL's base name; ``mace_off`` keeps the base name)."""
    import os

    fm = _foundations()
    family, url = foundation_models()[name]
    if family == "MACE-MP":
        if name == "medium-mpa-0" and os.path.isfile(fm.local_model_path):   # shipped with mace-torch
            return Path(fm.local_model_path)
        base = "".join(c for c in os.path.basename(url) if c.isalnum() or c in "_")
    else:
        base = os.path.basename(url).split("?")[0]
    return Path(fm.get_cache_dir()) / base


def resolve_checkpoint(checkpoint: str | Path | None) -> Path:
    """The model file of ``model.checkpoint``: a path, or the name of a MACE foundation model
    (``medium-mpa-0``, ``small``, ``off-medium``, ...: :func:`foundation_models`), which
    mace-torch's own loader finds in its cache or downloads there (machines with internet).
    Every failure is one line."""
    if not checkpoint:
        return DEFAULT_MODEL
    p = Path(checkpoint)
    if p.is_file():
        return p
    name = str(checkpoint)
    known = foundation_models()
    if name not in known:
        mp = ", ".join(n for n, (f, _) in known.items() if f == "MACE-MP")
        off = ", ".join(n for n, (f, _) in known.items() if f == "MACE-OFF")
        raise ValueError(f"model.checkpoint={name!r}: no such file, and not a foundation model name (MACE-MP: {mp}; "
                         f"MACE-OFF: {off}); give a mace-torch .model file or one of those names")
    import contextlib
    import io

    family, url = known[name]
    target = foundation_cache_path(name)
    fm = _foundations()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if family == "MACE-MP":   # mace_mp's own resolver: the cached file, else a download into the cache
                path = Path(fm.download_mace_mp_checkpoint(name))
            else:                     # mace_off resolves inline (and then unpickles freely): same cache, same name
                if not target.is_file():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    fm._urlretrieve_with_timeout(url, str(target))
                path = target
    except Exception as exc:  # noqa: BLE001 - no network, HTTP errors, a full disk, ...
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"model.checkpoint={name!r}: the {family} foundation model is not in mace-torch's cache "
                         f"({target}) and downloading {url} failed ({why}); download it on a machine with internet "
                         "and put it at that path, or give model.checkpoint=PATH") from None
    if not path.is_file():
        raise ValueError(f"model.checkpoint={name!r}: mace-torch's loader gave {path}, which is not a file")
    return path


