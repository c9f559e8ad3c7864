"""What fsspec's backends raise when a request fails, read one way for every store.

Each backend reports a failed request in its own terms:

- s3fs: ``FileNotFoundError``/``PermissionError``, or an ``OSError`` with botocore's error code
  in its text; botocore's ``NoCredentialsError`` when it finds no credentials.
- gcsfs: ``FileNotFoundError`` for a 404, ``OSError("Forbidden: ...")`` for a 403, its
  ``HttpError`` (the status in ``.code``) for the rest, a 401 when a request went out without
  credentials (gcsfs falls back to anonymous access when it finds none); google-auth's
  ``DefaultCredentialsError`` when ``token="google_default"`` finds none.
- adlfs: ``FileNotFoundError`` where it catches a 404 itself, azure-core's ``HttpResponseError``
  (the status in ``.status_code``) elsewhere, ``ServiceRequestError``/``ServiceResponseError``
  when the connection fails; a ``ValueError`` when it is given neither a connection string nor an
  account name, and azure-identity's "DefaultAzureCredential failed to retrieve a token" when it
  is given an account name alone and finds no credential for it.

:func:`fastdata.remote.filesystem.explain` turns all of these into fastdata's errors.
"""

from __future__ import annotations

import re

# exception class names (in the MRO) of a connection that failed or an answer that never came (azure-core)
TRANSIENT_NAMES = frozenset({"ServiceRequestError", "ServiceResponseError"})
_NO_CREDENTIALS_NAMES = {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError",
                         "CredentialUnavailableError"}
_NO_CREDENTIALS_TEXT = re.compile(
    r"Must provide either a connection_string or account_name"  # adlfs: nothing to connect with
    r"|DefaultAzureCredential failed to retrieve a token"  # azure-identity: an account name, no credential
)
_NOISE_LINE = re.compile(r"^(RequestId|Time):")  # azure-core's per-request lines, different every time
_BODY_LINE = re.compile(r"^Content:")  # azure-core's copy of the response body (XML), after the message
_LONGEST_CAUSE = 500


def status_of(exc: BaseException) -> int | None:
    """The HTTP status a backend's exception carries (azure-core's ``status_code``, aiohttp's
    ``status``, gcsfs's ``code``; for s3fs, botocore's response kept as the cause of the OSError it
    raises, e.g. ``[Errno 16] Service Unavailable`` for a 503), or None."""
    for name in ("status_code", "status", "code"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value < 600:
            return value
    for error in (exc, exc.__cause__):
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
    return None


def is_transient_status(status: int) -> bool:
    """Whether an answer with HTTP ``status`` is worth another attempt: request timeout, too many
    requests, any 5xx."""
    return status >= 500 or status in (408, 429)


def lacks_credentials(exc: BaseException) -> bool:
    """Whether ``exc`` says the backend found no credentials to send (rather than that the
    server refused the ones it sent)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & _NO_CREDENTIALS_NAMES) or bool(_NO_CREDENTIALS_TEXT.search(str(exc)))


def one_line(text: str) -> str:
    """``text`` on one line: its lines joined, azure-core's request id, time and copy of the
    response body left out, and only the first line when the whole would be longer than a few
    hundred characters (azure-identity lists every credential it tried, one per line)."""
    lines = []
    for line in map(str.strip, text.splitlines()):
        if _BODY_LINE.match(line):
            break
        if line and not _NOISE_LINE.match(line):
            lines.append(line)
    joined = " ".join(lines)
    if len(joined) > _LONGEST_CAUSE and len(lines) > 1:
        return f"{lines[0]} ..."
    return joined
