"""Which MLflow store a run writes to, and the checks that answer within seconds, before any
training, whether it can: a store that is not there, not writable, not MLflow's, or not
answering is one :class:`runner.errors.UserError` naming ``tracking.uri``. During a run, a store
lost is a :class:`StoreLost`; a store's answer that what a job creates exists already (another
job created it at the same moment, :func:`already_exists`) is not.

Nothing here changes a file that is not an MLflow store: an existing sqlite file is read
read-only (:func:`sqlite_tables`) before MLflow may touch it, and a database of another
application is refused as it is.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import tempfile
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from runner.errors import EnvironmentFailure, UserError

if TYPE_CHECKING:  # the core's recorder imports torch, which checking a store does not need
    from runner.train.recorder import Row

SQLITE_HEADER = b"SQLite format 3\x00"
# Tables every MLflow database store has (its schema's version and its experiments).
MLFLOW_TABLES = {"alembic_version", "experiments"}
DATABASES = ("postgresql", "mysql", "mssql")  # SQLAlchemy dialects MLflow stores runs in
CHECK_SECONDS = 10  # a store check answers within this, whatever the network does


def resolve_uri(uri: str | None) -> str:
    """The store to use: ``uri`` when given, else MLflow's own ``MLFLOW_TRACKING_URI`` when set,
    else :func:`project_store`."""
    if uri:
        return uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return project_store()


def project_store() -> str:
    """The store of the folder a command starts in: ``mlflow.db`` there (MLflow's own default
    store, artifacts in ``mlartifacts/`` beside it), what ``samplerlab ui`` started in the same
    folder serves. Never the folder samplerlab is installed in, a source checkout included: a
    command started elsewhere writes nothing into it."""
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def browse_command(uri: str) -> str:
    """How a user browses the store at ``uri`` (resolved): ``samplerlab ui`` for the store of
    the folder they are in, the server's own address for a tracking server, else
    ``samplerlab ui --uri URI``."""
    if uri == project_store():
        return "samplerlab ui"
    if uri.startswith(("http://", "https://")):
        return f"open {uri.rstrip('/')}"
    return f"samplerlab ui --uri {uri}"


def store_error(uri: str, problem: str, fix: str, parameter: str = "tracking.uri") -> UserError:
    return UserError(f"{parameter}={uri!r}: {problem}\n{fix}")


# How a unique constraint refuses a row another writer committed first, in the words of each
# database MLflow stores runs in: MLflow's session passes the driver's message on as BAD_REQUEST.
UNIQUE_VIOLATIONS = (
    "duplicate key value violates unique constraint",  # PostgreSQL
    "UNIQUE constraint failed",  # SQLite
    "Duplicate entry",  # MySQL
    "Violation of UNIQUE KEY constraint",  # SQL Server
    "Violation of PRIMARY KEY constraint",  # SQL Server
)


def already_exists(error: BaseException) -> bool:
    """Whether ``error`` is a store's answer that what a call creates exists already, because
    another job created it at the same moment: MLflow's ``RESOURCE_ALREADY_EXISTS``, or a unique
    constraint's refusal (what a sweep's jobs meet when they log the same new dataset at once).
    Any other error, a foreign-key or not-null violation included, is not."""
    from mlflow.exceptions import MlflowException

    if not isinstance(error, MlflowException):
        return False
    if error.error_code == "RESOURCE_ALREADY_EXISTS":
        return True
    return error.error_code == "BAD_REQUEST" and any(
        words in error.message for words in UNIQUE_VIOLATIONS
    )


QUICK_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


@contextmanager
def quick_http() -> Iterator[None]:
    """MLflow retries an unreachable server for minutes; a check should take seconds."""
    saved = {k: os.environ.get(k) for k in QUICK_HTTP}
    os.environ.update(QUICK_HTTP)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def bound_http_retries(retries: int, timeout: int) -> None:
    """MLflow's HTTP client retries a lost server with a doubling back-off for minutes by default;
    a run waits at most ``retries`` attempts of ``timeout`` seconds with pauses of 1, 2, 4, ...
    seconds. Variables the user set are left as they are."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(retries))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(timeout))


class StoreLost(EnvironmentFailure):
    """The store stopped answering during a run, after MLflow's retries (bounded by
    ``tracking.retries`` and ``tracking.request_timeout``), or kept answering "exists already"
    after the tries again that such a conflict gets. ``unlogged``: the metric rows it may not
    have received, to send again when the run resumes."""

    exit_code = 75  # EX_TEMPFAIL: try again later

    def __init__(self, message: str, unlogged: list[Row]) -> None:
        super().__init__(message)
        self.unlogged = unlogged

    def __reduce__(self) -> tuple[type[StoreLost], tuple[str, list[Row]]]:
        # Crosses process boundaries (joblib's workers return it to the sweep).
        return type(self), (str(self), self.unlogged)

    @classmethod
    def during(cls, uri: str, what: str, error: BaseException, unlogged: list[Row]) -> StoreLost:
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        # A conflict that outlasted its retries is said as what it is, not as a lost store.
        if already_exists(error):
            problem = "the store answered that what this creates exists already"
        else:
            problem = "the store stopped answering"
        return cls(
            f"tracking.uri={uri!r}: {problem} while {what} ({type(error).__name__}: {first})",
            unlogged,
        )


def sqlite_path(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def sqlite_tables(path: Path) -> set[str] | None:
    """The tables of the SQLite file at ``path``; None when it is missing or empty (a store
    MLflow may create). Read without creating or changing any file: a rollback-journal file
    (MLflow's kind) in read-only mode, under SQLite's shared lock, so that a write another
    process has in progress (a job logging) is waited for, at most :data:`CHECK_SECONDS`, and
    not read half-done. A WAL file, whose read-only connections may create the -shm file beside
    it, is read with ``immutable=1`` (no lock), as is a file a crashed writer left with a hot
    journal (which only a writer may roll back). Raises ValueError when the file is not an
    SQLite database, or is another program's in write-ahead logging with its tables still in
    the log, and TimeoutError when another process holds it locked throughout."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, "rb") as file:
        header = file.read(100)
    if not header.startswith(SQLITE_HEADER):
        raise ValueError(f"{path} is not an SQLite database (it does not start with its header)")
    uri = path.resolve().as_uri()
    wal = header[18:19] == b"\x02"  # the header's write version: 1 rollback journal, 2 WAL
    left_mid_write = ""
    try:
        if not wal:
            try:
                return _table_names(f"{uri}?mode=ro")
            except sqlite3.OperationalError as error:
                if error.sqlite_errorcode == sqlite3.SQLITE_BUSY:
                    raise TimeoutError(
                        f"{path} stayed locked by another process for {CHECK_SECONDS} s"
                    ) from None
                if error.sqlite_errorcode != sqlite3.SQLITE_READONLY_ROLLBACK:
                    raise
                left_mid_write = f", left mid-write by a process that stopped ({path.name}-journal)"
        tables = _table_names(f"{uri}?immutable=1")
    except sqlite3.DatabaseError as error:
        raise ValueError(
            f"{path} cannot be read as an SQLite database{left_mid_write} ({error})"
        ) from None
    log = path.with_name(path.name + "-wal")
    if wal and not tables and log.exists() and log.stat().st_size > 0:
        raise ValueError(
            f"{path} is in write-ahead logging, with changes in {log.name} not yet in the "
            "file: another program's database, in use"
        )
    return tables


def _table_names(uri: str) -> set[str]:
    connection = sqlite3.connect(uri, uri=True, timeout=CHECK_SECONDS)
    try:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        return {name for (name,) in rows}
    finally:
        connection.close()


def check_sqlite_store(uri: str, parameter: str = "tracking.uri", create: bool = True) -> None:
    """An existing sqlite file must be an MLflow store (or empty, when ``create``): another
    application's database, or a file that is not one, is refused and left as it is."""
    path = sqlite_path(uri)
    assert path is not None
    try:
        tables = sqlite_tables(path)
    except ValueError as error:
        raise store_error(
            uri, str(error), f"point {parameter} at an MLflow sqlite store", parameter
        ) from None
    except TimeoutError as error:
        raise store_error(
            uri, str(error), "try again once the process writing it has finished", parameter
        ) from None
    if tables is None or not tables:
        if create:
            return
        raise store_error(
            uri,
            f"there is no MLflow store at {path}",
            f"check {parameter} (a report reads a store and never creates one)",
            parameter,
        )
    if not tables >= MLFLOW_TABLES:
        shown = ", ".join(sorted(tables)[:6]) + (", ..." if len(tables) > 6 else "")
        raise store_error(
            uri,
            f"{path} is a database of another application (tables: {shown}), not an MLflow store",
            f"point {parameter} at an MLflow store{' or at a new file' if create else ''}; "
            "this one is left unchanged",
            parameter,
        )


def _bounded(check: Callable[[], None], seconds: float) -> BaseException | None:
    """Run ``check()`` in a daemon thread for at most ``seconds``: its exception, a
    TimeoutError when it did not answer in time, or None."""
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            check()
            outcome.append(None)
        except BaseException as error:  # reported to the caller, whatever it is
            outcome.append(error)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        return TimeoutError(f"no answer within {seconds:.0f} s")
    return outcome[0]


def check_database(uri: str) -> None:
    """One connection to a database store (postgresql, mysql, mssql), without MLflow's retries
    (ten attempts with growing pauses, about 100 s) and within :data:`CHECK_SECONDS`."""

    def connect() -> None:
        import sqlalchemy

        engine = sqlalchemy.create_engine(uri, pool_pre_ping=False)
        try:
            engine.connect().close()
        finally:
            engine.dispose()

    error = _bounded(connect, CHECK_SECONDS)
    if error is None:
        return
    if isinstance(error, ModuleNotFoundError):
        raise store_error(
            uri,
            f"its database driver is not installed ({error})",
            "install the driver, or name one that is: postgresql+psycopg://... (psycopg 3 is "
            "installed with samplerlab)",
        )
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    raise store_error(
        uri,
        f"the database does not answer ({type(error).__name__}: {first})",
        "start it (make server starts PostgreSQL with an MLflow server), check host, port and "
        "credentials, or drop the override to use the project store",
    )


def prepare_store(uri: str) -> None:
    """Check, within seconds, that the store at ``uri`` is reachable and writable (and MLflow's),
    and create or migrate it once. A new sqlite store is migrated under an exclusive lock on its
    folder, so processes that start together on it do not race MLflow's schema migrations."""
    path = sqlite_path(uri)
    if path is not None:
        folder = path.parent
        if not folder.is_dir():
            raise store_error(
                uri,
                f"the folder {folder} does not exist",
                "create it, or drop the override to use the project store",
            )
        try:  # os.access says yes to root even where nothing can be written (/proc)
            tempfile.TemporaryFile(dir=folder).close()
            if path.exists():
                open(path, "ab").close()
        except OSError as error:
            raise store_error(
                uri,
                f"cannot write to {path} ({error.strerror})",
                "choose a writable path, or drop the override to use the project store",
            ) from error
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            check_sqlite_store(uri)
            _read_store(
                uri, "not a usable MLflow store", "point tracking.uri at an MLflow sqlite file"
            )
        finally:
            os.close(descriptor)  # releases the lock
        return
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=5) as answer:
                answer.read()
        except (OSError, ValueError) as error:
            raise store_error(
                uri,
                f"no MLflow server answers there ({getattr(error, 'reason', error)})",
                "start one (make server, or mlflow server --host 127.0.0.1 --port PORT), or drop the override to use the local store",
            ) from error
        return
    if uri.split(":", 1)[0].split("+", 1)[0] in DATABASES:
        check_database(uri)
    _read_store(uri, "the store cannot be read", "check the URI")


def _read_store(uri: str, problem: str, fix: str) -> None:
    """One read, which also creates or migrates a database store."""
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as error:
        why = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        raise store_error(
            uri, f"{problem} ({why})", f"{fix}, or drop the override to use the project store"
        ) from error
