"""Credentials never reach the log: a filter on the loggers that may quote a request.

aiohttp refuses a request it cannot parse (a header with a NUL byte, a line too long)
before any dmq code runs, and logs the refusal at ERROR with a traceback whose message
quotes the offending raw header line: `Authorization: Bearer bob:<password>` included.
`install()` (dmq/server.py calls it at start) puts `RedactingFilter` on aiohttp's server
and web loggers and on dmq's own HTTP logger; it rewrites every record they log:

- the value of any `Authorization`, `Proxy-Authorization`, `Cookie` or `X-Dmq-*` header
  quoted in the message or the traceback becomes `<redacted>`;
- a request aiohttp could not parse (HttpProcessingError) is one WARNING line naming the
  caller's address and what was wrong, without the traceback: it is the client's
  mistake, not the broker's, and the traceback says nothing more.
"""

from __future__ import annotations

import logging
import re
import traceback
from typing import Final

from aiohttp.http_exceptions import HttpProcessingError

# A header name that carries a credential, then its value up to the end of the line or
# of the quoted bytes (aiohttp quotes the raw line as b'...'; a dict quotes both).
_SECRET_HEADER: Final = re.compile(
    r"(?i)\b(authorization|proxy-authorization|cookie|x-dmq-[a-z0-9-]+)(['\"]?\s*:\s*['\"]?)[^\r\n'\"]*"
)
REDACTED: Final = "<redacted>"
LOGGERS: Final = ("aiohttp.server", "aiohttp.web", "aiohttp.access", "dmq.http")


def redact(text: str) -> str:
    """`text` with the value of every credential header it quotes replaced."""
    return _SECRET_HEADER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)


class RedactingFilter(logging.Filter):
    """Rewrites a record so that no credential header value is in it (module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            what = redact(record.getMessage())
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "refused a malformed request (%s): %s"
            record.args = (what, redact(str(exc.message)).strip()[:500])
            record.exc_info, record.exc_text = None, None
            return True
        message = record.getMessage()
        record.msg, record.args = redact(message), None
        if record.exc_info:
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            record.exc_info, record.exc_text = None, redact(text)
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install() -> None:
    """Put one RedactingFilter on each logger of LOGGERS (idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
