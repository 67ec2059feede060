"""Mail sent off the request's thread: after the caller's transaction committed, on one of at most `MAIL_THREADS`
threads behind a bounded queue. A flood of signups while the mail server hangs (each message may take its timeouts)
queues up to `OUTBOX` mails and drops the rest, rather than starting a thread for each; a failure is logged, never
raised (the user may ask for another mail)."""

from __future__ import annotations

import logging
import queue
import threading

from suanli.mail import Mail, Mailer, MailError

log = logging.getLogger("suanli.mail")

MAIL_THREADS = 8  # threads sending verification mail, at most, however many signups come at once
OUTBOX = 500  # mails waiting for one of them; past that a mail is dropped (logged; the user may ask again)
_outbox: queue.Queue[tuple[Mailer, Mail]] = queue.Queue(OUTBOX)
_senders: list[threading.Thread] = []
_senders_lock = threading.Lock()


def _sender() -> None:
    while True:
        mailer, mail = _outbox.get()
        try:
            mailer.send(mail)
        except MailError as e:
            log.warning("verification mail not sent: %s", e)
        except Exception:  # a bug in a mailer must not kill the thread silently
            log.exception("verification mail not sent")
        finally:
            _outbox.task_done()


def send_later(mailer: Mailer, mail: Mail) -> bool:
    """Queue `mail` for one of the sending threads (starting one if fewer than `MAIL_THREADS` run). False: dropped,
    the queue being full."""
    try:
        _outbox.put_nowait((mailer, mail))
    except queue.Full:
        log.warning("verification mail to %s not sent: %d mails wait for the mail server already", mail.to, OUTBOX)
        return False
    with _senders_lock:
        _senders[:] = [t for t in _senders if t.is_alive()]
        if len(_senders) < MAIL_THREADS:
            t = threading.Thread(target=_sender, name="suanli-mail", daemon=True)
            t.start()
            _senders.append(t)
    return True
