"""The store's scripts as programs a line sends: one Redis Functions library (FCALL), or each
script on its own (EVALSHA) where the server has no functions or the store's user may not load
them."""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from celery_interval.stores.redis_client import refused_for_now
from celery_interval.stores.scripts import LIBRARY_PARTS, SCRIPT_NAMES, lua_text, script_source

__all__ = [
    "SCRIPT_COMMANDS",
    "EvalScript",
    "LibraryFunction",
    "Program",
    "library_source",
    "programs",
    "supports",
]

logger = logging.getLogger("celery_interval")

#: The scripts that only read: their functions answer while the server refuses writes (out
#: of memory, a failed save), as their scripts did by EVALSHA.
READ_ONLY = frozenset({"status"})
#: The commands that run a script or function (INFO commandstats counts each call).
SCRIPT_COMMANDS = ("evalsha", "eval", "fcall")


class Program(Protocol):
    """What a line sends for one script: loaded once per connection (by ``sha``), then called."""

    @property
    def sha(self) -> str:
        """Names what ``load`` puts on the server (a script's SHA1, a library's name)."""

    def load(self) -> tuple[Any, ...]:
        """The command that puts the program on the server."""

    def call(self, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        """The command that runs it."""

    def missing(self, exc: ResponseError) -> bool:
        """Whether a call's error says the server does not hold the program (load it again)."""

    def loaded_by(self, exc: ResponseError) -> bool:
        """Whether a load's error still leaves the program on the server."""


@dataclass(frozen=True)
class EvalScript:
    """A script called by EVALSHA (``sha`` as redis-py's ``Script.sha``)."""

    script: str

    @functools.cached_property
    def sha(self) -> str:
        return hashlib.sha1(self.script.encode("utf-8")).hexdigest()

    def load(self) -> tuple[Any, ...]:
        return ("SCRIPT", "LOAD", self.script)

    def call(self, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def missing(self, exc: ResponseError) -> bool:
        return isinstance(exc, NoScriptError)

    def loaded_by(self, exc: ResponseError) -> bool:
        return False


@dataclass(frozen=True)
class LibraryFunction:
    """One script of the library ``library`` (its name), called by FCALL: the library's code
    runs once as it loads, not at each call as a script's does."""

    library: str
    source: str
    name: str

    @property
    def sha(self) -> str:
        return self.library

    def load(self) -> tuple[Any, ...]:
        return ("FUNCTION", "LOAD", self.source)

    def call(self, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        return ("FCALL", f"{self.library}_{self.name}", len(keys), *keys, *args)

    def missing(self, exc: ResponseError) -> bool:
        return str(exc).startswith("Function not found")

    def loaded_by(self, exc: ResponseError) -> bool:
        return _exists(exc)


def _exists(exc: ResponseError) -> bool:
    """Whether FUNCTION LOAD's error says the library is on the server already."""
    return "already exists" in str(exc)


@functools.cache
def library_source(fenced: bool) -> tuple[str, str]:
    """The library's name and text: lib.lua and the parts the scripts share, once, then each
    script as a function of its keys and arguments, which first empties the call's caches
    (lib.lua's ``call_begins``: the library's locals live from one call to the next). The
    name carries the text's hash, so workers of different versions each call their own."""
    bodies = [
        f"local function run_{name}(KEYS, ARGV)\ncall_begins()\n{lua_text(name)}\nend"
        for name in SCRIPT_NAMES
    ]
    registered = [
        f"redis.register_function{{function_name='LIBRARY_{name}', callback=run_{name}"
        + (", flags={'no-writes'}}" if name in READ_ONLY else "}")
        for name in SCRIPT_NAMES
    ]
    code = "\n".join(
        [
            f"local FENCED = {'true' if fenced else 'false'}",
            *map(lua_text, LIBRARY_PARTS),
            *bodies,
            *registered,
        ]
    )
    library = "celery_interval_" + hashlib.sha1(code.encode("utf-8")).hexdigest()[:16]
    return library, f"#!lua name={library}\n" + code.replace("'LIBRARY_", f"'{library}_")


def programs(fenced: bool, functions: bool) -> dict[str, Program]:
    """Each script's program by name: the library's functions, or scripts of their own."""
    if not functions:
        return {name: EvalScript(script_source(name, fenced)) for name in SCRIPT_NAMES}
    library, source = library_source(fenced)
    return {name: LibraryFunction(library, source, name) for name in SCRIPT_NAMES}


def supports(client: Any, fenced: bool, where: str) -> bool:
    """Load the library on ``client``'s server: whether its functions can be called (False: a
    server without functions, Redis < 7, a user the ACL does not let load them, or any other
    refusal of the library; logged). An error reply that passes (out of memory, a failed save:
    ``refused_for_now``) raises, and the next call asks again."""
    _library, source = library_source(fenced)
    try:
        client.execute_command("FUNCTION", "LOAD", source)
    except ResponseError as exc:
        if _exists(exc):
            return True
        if refused_for_now(exc) and not isinstance(exc, NoPermissionError):
            raise
        logger.info("interval store %s: scripts by EVALSHA, not FCALL (%s)", where, exc)
        return False
    return True
