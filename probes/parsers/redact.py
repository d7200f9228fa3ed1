"""Redaction of secrets in what the target hands over (argv, environment, thread and frame names).

Applied where the data enters trainprobe (procfs.parse_cmdline/parse_argv, every artifact a probe
records through its Recorder, every provenance line), and again when a bundle is read back
(agent.bundle), so no renderer ever sees a secret. What is hidden (each value becomes `***`; the
name stays, so a reader sees that something was there):

- the value of an option, `NAME=value`, `NAME: value` (YAML), `"NAME": "value"` (JSON, Python) or
  dict entry whose name holds a credential word: key, token, secret, password/passwd/pwd, pass,
  passphrase, auth, authorization, bearer, credential, cookie, session/sessionid, signature, in any
  case, inside longer names and in the plural (`--api-keys`, `DB_PASSWORD`, `--db-pass`,
  `MY_SERVICE_TOKEN`, `x-api-key`, `private_key`, `jsessionid`), but not inside other words
  (tokenizer, keyboard, author, bypass, compass, passes). In argv the value may be the next element,
  even one that starts with `-` (`--password -x9Secret`), unless that element is itself an option
  (`--lr`, `-v`);
- a plain number after a name that counts tokens, keys or sessions is kept (see `_counts`):
  `--max-tokens 512`, `tokens_per_batch=4096`, `--key-frames 3`, `--num-sessions 2`; a number after
  any other credential name is hidden (`--password 123456`, `--token 42`);
- `-p VALUE` (`-p` is a password flag in some tools and a port or a count in others): hidden unless
  VALUE is a port-like number (1 to 5 digits, at most 65535): `-p 8` and `-p 29500` stay readable
  (they are in the commands the report prints), `-p hunter2`, `-p 1234567` and `-phunter2` do not;
- headers: `Authorization: Bearer X` -> `Authorization: Bearer ***`, `Cookie: a=b; c=d` -> `Cookie: ***`;
- URLs: the user-info (`https://user:pass@host/` -> `https://***@host/`) and query parameters named
  like a credential, plus `sig` and `sas` (`?token=***&sig=***`);
- well-known token formats anywhere in free text, the prefix kept: GitHub (`ghp_`, `gho_`, `ghu_`,
  `ghs_`, `ghr_`, `github_pat_`), Hugging Face (`hf_`), OpenAI (`sk-`), AWS key ids (`AKIA`, `ASIA`),
  Slack (`xoxb-`, `xoxp-`, ...), JWTs (`eyJ...eyJ...`), PEM private key blocks;
- whatever matches a pattern the operator adds with `--redact REGEX` (repeatable).

The environment never reaches a report: procfs.parse_environ_whitelist keeps only named variables.

Limits, chosen to err towards hiding: in free text an unquoted value ends at whitespace (in argv the
whole element is hidden); a value after a credential option is kept when it looks like an option
itself (`--password --lr`); a single-dash word that starts with -p (`-pretrained`) loses the rest.

Cost: a string is first searched for hints (`_maybe`); each rule then runs only if the lowered text
holds what it needs. A large JSON document (a py-spy trace) is redacted in place (`_splice`): only
the literals around a hint are decoded, so a trace with a secret costs about what a clean one does.
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any, Iterable

MASK = "***"


class _Lazy:
    """A pattern compiled on its first use: most runs meet no string that needs a given rule, and
    compiling them all is most of the module's cost to the agent's start-up (about 25 ms here)."""

    __slots__ = ("_args", "_rx")

    def __init__(self, pattern: str, flags: int = 0):
        self._args = (pattern, flags)
        self._rx: re.Pattern[str] | None = None

    def __getattr__(self, name: str) -> Any:      # sub, search, match, fullmatch, finditer, pattern
        rx = self._rx
        if rx is None:
            rx = self._rx = re.compile(*self._args)
        return getattr(rx, name)


# Credential words: matched inside longer names and in the plural, never followed by another letter
# (so tokenizer, keyboard, author do not match). `pass` stands as a word of its own (db-pass, --pass,
# DBPASS), so that bypass, compass and passes are not names of secrets.
_WORD = (r"(?:passw(?:or)?ds?|passphrases?|(?<![a-z])(?:db|pg|my|sql|user|admin|root)?pass|pwd|secrets?"
         r"|tokens?|keys?|auth|authori[sz]ations?|bearers?|credentials?|cookies?|sessions?(?:_?ids?)?|sessid"
         r"|signatures?)(?![a-z])")
_NAME = rf"[A-Za-z0-9_.\-]*?{_WORD}[A-Za-z0-9_.\-]*"
# Characters that end a value inside free text: whitespace, quotes, escapes, and what HTML, JSON
# or a shell put around a word.
_STOP = r"\s\"'\\,;&<>`|)(\]\["
# What follows a credential option in free text and is another option, not its value: --lr, -v, --
_OPTION_AHEAD = rf"(?!--[A-Za-z]|--(?![^{_STOP}])|-[A-Za-z](?![^{_STOP}]))"
_QUOTED = r"\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'"
_SCHEMES = r"(?:basic|bearer|digest|token|negotiate|ntlm|aws4-hmac-sha256|apikey|key)"

# -- counts are not secrets ----------------------------------------------------------------------------
# ML tools name amounts with the same words: max_tokens, num_keys, key_frames, sessions. A plain
# number after such a name is kept; a number after password, pass, secret, auth, cookie, bearer,
# credential, signature or session ids is not (PINs and numeric passwords exist).
_COUNTABLE = frozenset({"token", "tokens", "key", "keys", "session", "sessions"})
_COUNT_WORDS = frozenset({"max", "min", "num", "n", "nb", "number", "total", "count", "per", "limit", "size",
                          "len", "length", "top", "budget"})
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_PORT = re.compile(r"\d{1,5}")


@functools.lru_cache(maxsize=4096)
def _counts(name: str) -> bool:
    """Whether `name` reads as a count of tokens, keys or sessions: every credential word in it is
    one of those, no api/access/private qualifier is next to it, and either a count word is there
    (max_tokens, num_keys, tokens_per_batch, maxtokens), or the word is plural (tokens, keys), or
    it qualifies a later word (key_frames, token_budget)."""
    norm = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower().strip("-_.")
    found = list(_word_rx().finditer(norm))
    if not found or any(m.group(0) not in _COUNTABLE for m in found):
        return False
    if re.search(r"(?:api|access|private)[-_.]?(?:keys?|tokens?)", norm):
        return False
    words = re.split(r"[-_.]+", norm)
    if any(w in _COUNT_WORDS for w in words) or re.search(r"(?:^|[-_.])(?:max|min|num|n|total)(?:tokens?|keys?)",
                                                          norm):
        return True
    if any(m.group(0).endswith("s") for m in found):
        return True
    return found[-1].end() < len(norm)


def _is_number(v: str) -> bool:
    return len(v) <= 12 and _NUMBER.fullmatch(v) is not None


def _is_port(v: str) -> bool:
    return _PORT.fullmatch(v) is not None and int(v) <= 65535


def _secret(name: str, v: str) -> bool:
    """Whether `v`, the value of the credential name `name`, is to be hidden."""
    if name == "-p":
        return not _is_port(v) and not v.startswith(MASK)
    bare = v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'" else v
    if bare.startswith(MASK):
        return False
    return not (_is_number(bare) and _counts(name))


def _masked(v: str) -> str:
    """`***`, in the quotes `v` came in."""
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        return v[0] + MASK + v[0]
    if v.startswith('\\"'):
        return '\\"' + MASK + '\\"'
    return MASK


@functools.lru_cache(maxsize=None)
def _word_rx() -> re.Pattern[str]:
    return re.compile(_WORD, re.IGNORECASE)


@functools.lru_cache(maxsize=None)
def _name_rx() -> re.Pattern[str]:
    return re.compile(_NAME, re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def is_credential_name(name: str) -> bool:
    """Whether `name` (an option, a variable, a dict key, a header) names a credential."""
    return _name_rx().fullmatch(name.lstrip("-")) is not None


# -- the rules ---------------------------------------------------------------------------------------

def _named(m: re.Match[str]) -> str:
    """A NAME + separator + value match: the value hidden, unless it is a count."""
    head, name, v = m.group("head"), m.group("name"), m.group("v")
    return head + (_masked(v) if _secret(name, v) else v)


def _dash_p(m: re.Match[str]) -> str:
    v = m.group("v")
    return m.group("head") + (_masked(v) if _secret("-p", v) else v)


def _glued_p(m: re.Match[str]) -> str:
    v = m.group("v")
    if _is_port(v) or re.fullmatch(r"[a-z]{1,3}", v):      # -p8080, or combined flags (-pv)
        return m.group(0)
    return m.group("head") + MASK


_NEEDS_WORD = ("a credential word",)   # a rule's guard, compared by identity: _word_rx must match
# (what the lowered text must hold, pattern, replacement) and, for a credential word's rule, the
# punctuation it cannot match without (one of each group). Each rule compiles on its first use and the
# four NAME rules take 1.2-1.7 ms each, so a command line holding `--auth-required` compiles only the
# option rule.
_Rule = tuple[Any, ...]
_COLON, _QUOTES, _EQUALS, _DASH = (":",), ('"', "'"), ("=",), ("-",)


@functools.lru_cache(maxsize=None)
def _rules() -> tuple[re.Pattern[str], re.Pattern[str], tuple[_Rule, ...]]:
    """The rules, each compiled on its own first use (`_Lazy`: most runs never meet a string that
    needs them, and compiling them all is about 25 ms of the agent's start-up)."""
    i = re.IGNORECASE
    # An argv element that is only an option name (the value is the next element): --hf-token
    opt_only = _Lazy(rf"^--?(?:[A-Za-z0-9]+[-_])*?{_NAME}$", i)
    # NAME=value / --name=value inside one argv element: everything after `=` is the value.
    arg_pair = _Lazy(rf"^(--?)?({_NAME})(=)(.+)$", i | re.DOTALL)
    value = rf"(?P<v>{_QUOTED}|\\\"(?:[^\"\\\n]|\\[^\"])*\\\"|\{{[^{{}}\n]*\}}|\[[^\[\]\n]*\]|[^{_STOP}{{}}]+)"
    # Each rule with what it needs in the lowered text to match at all (or a credential word), so a
    # string runs only the rules it could meet.
    text_rules: tuple[_Rule, ...] = (
        # PEM private key blocks (a truncated one is hidden to the end)
        (("-----begin",),
         _Lazy(r"(-----BEGIN ([A-Z0-9 ]*PRIVATE KEY)-----)(?!\*\*\*).*?(?:-----END \2-----|\Z)", re.DOTALL),
         r"\1***-----END \2-----"),
        # URL user-info
        (("://",), _Lazy(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/\s:@\"'<>]+(?::[^/\s@\"'<>]*)?@"), r"\1" + MASK + "@"),
        # sig= and sas= query parameters (Azure SAS); other credential names are caught below
        (("sig=", "sas="), _Lazy(r"([?&;](?:sig|sas)=)(?!\*\*\*)[^&#\s\"'<>]+", i), r"\1" + MASK),
        # Authorization: <scheme> <credentials> (the scheme stays); Cookie: ..., Set-Cookie: ...
        (_NEEDS_WORD,
         _Lazy(rf"(\b(?:proxy-)?authori[sz]ation\s*+:\s*+(?:{_SCHEMES}\s++)?+)(?!\*\*\*)[^\r\n\"'<>]+", i),
         r"\1" + MASK, (_COLON,)),
        (_NEEDS_WORD, _Lazy(r"(\b(?:set-)?cookies?\s*+:\s*+)(?!\*\*\*)[^\r\n\"'<>]+", i), r"\1" + MASK, (_COLON,)),
        # "NAME": value, 'NAME': value, \"NAME\": \"value\" (JSON, Python dicts, escaped JSON)
        (_NEEDS_WORD,
         _Lazy(rf"(?P<head>(?<![A-Za-z0-9_.\-])(?P<q>\\?[\"'])(?P<name>{_NAME})(?P=q)\s*:\s*)(?!\*\*\*)" + value, i),
         _named, (_QUOTES, _COLON)),
        # NAME: value (YAML, a header named like a credential: x-api-key: ...)
        (_NEEDS_WORD,
         _Lazy(rf"(?P<head>(?<![A-Za-z0-9_.\-])(?P<name>{_NAME}):[ \t]+)(?!(?:{_SCHEMES}[ \t]+)?\*\*\*)" + value, i),
         _named, (_COLON,)),
        # NAME = "quoted", NAME=value, --name=value (the value ends at whitespace or a quote)
        (_NEEDS_WORD, _Lazy(rf"(?P<head>\b(?P<name>{_NAME})\s*=(?!=)\s*)(?!\*\*\*)" + value, i), _named, (_EQUALS,)),
        # --name value (an option followed by its value as the next word)
        (_NEEDS_WORD, _Lazy(rf"(?P<head>(?<![\w-])--?(?P<name>{_NAME})[ \t]+){_OPTION_AHEAD}(?!\*\*\*)"
                          rf"(?P<v>{_QUOTED}|[^{_STOP}]+)", i), _named, (_DASH,)),
        # -p VALUE, -pVALUE (a password in some tools; a port or a count, kept, in others)
        (("-p",), _Lazy(rf"(?P<head>(?:^|(?<=\s))-p[ \t]+){_OPTION_AHEAD}(?!\*\*\*)(?P<v>{_QUOTED}|[^{_STOP}]+)"),
         _dash_p),
        (("-p",), _Lazy(rf"(?P<head>(?:^|(?<=\s))-p)(?!\*\*\*)(?P<v>[^{_STOP}\-][^{_STOP}]*)"), _glued_p),
        # Bearer <token> on its own
        (("bearer",), _Lazy(r"(\bbearer[ \t]+)(?!\*\*\*)[A-Za-z0-9._~+/=\-]{8,}", i), r"\1" + MASK),
        # Well-known token formats, anywhere
        (("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
         _Lazy(r"\b(gh[pousr]_)[A-Za-z0-9]{20,}|\b(github_pat_)[A-Za-z0-9_]{20,}"),
         lambda m: (m.group(1) or m.group(2)) + MASK),
        (("hf_",), _Lazy(r"\b(hf_)[A-Za-z0-9]{20,}"), r"\1" + MASK),
        (("sk-",), _Lazy(r"(?<![A-Za-z0-9_\-])(sk-)(?=[A-Za-z0-9_\-]*\d)[A-Za-z0-9_\-]{20,}"), r"\1" + MASK),
        (("akia", "asia"), _Lazy(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b"), r"\1" + MASK),
        (("xox",), _Lazy(r"\b(xox[abposr]-)[A-Za-z0-9\-]{10,}"), r"\1" + MASK),
        (("eyj",), _Lazy(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"), "eyJ" + MASK),
    )
    return opt_only, arg_pair, text_rules


# -- the prefilter -------------------------------------------------------------------------------------
# Cheap test first: most strings (frame names, file names, whole traces) hold nothing a rule could
# match. Every rule needs one of these (lower-cased) in the string, or the string starting with -p.
_HINTS = ("key", "token", "secret", "pass", "pwd", "auth", "credential", "cookie", "bearer", "sess", "signature",
          "://", " -p", "hf_", "sk-", "akia", "asia", "xox", "eyj", "github_pat_")
_GH = re.compile(r"gh[pousr]_")                # GitHub's prefixes: one scan instead of five
_MAYBE = _Lazy("|".join(map(re.escape, _HINTS)) + r"|gh[pousr]_|^-p", re.IGNORECASE)
# The only non-ASCII characters that lower() turns into ASCII, or that a case-blind regex matches
# with an ASCII letter (U+0130 İ, U+0131 ı, U+017F ſ, U+212A Kelvin sign).
_FOLDS_TO_ASCII = "\u0130\u0131\u017f\u212a"


def _maybe(s: str) -> bool:
    """Whether a rule could match `s`: the same answer as the case-blind regex `_MAYBE`, 20-50x
    faster on a large trace: the text is lowered and searched with `in`. Text holding one of the
    four characters whose case folding lower() does not reproduce goes through the regex."""
    if not s.isascii() and any(c in s for c in _FOLDS_TO_ASCII):
        return _MAYBE.search(s) is not None
    low = s.lower()
    return any(h in low for h in _HINTS) or low.startswith("-p") or _GH.search(low) is not None


_extra: list[re.Pattern[str]] = []


class RedactPatternError(ValueError):
    """A --redact pattern that is not a valid regular expression."""


def compile_patterns(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as exc:
            raise RedactPatternError(f"--redact {p!r} is not a valid regular expression: {exc}") from None
    return out


def configure(patterns: Iterable[str] = ()) -> list[str]:
    """Set the operator's extra patterns (`--redact`) for this process. Returns them as given."""
    global _extra
    given = list(patterns)
    _extra = compile_patterns(given)
    return given


def extra_patterns() -> list[str]:
    return [p.pattern for p in _extra]


def text(s: str) -> str:
    """Redact free text: a command line, a thread or frame name, a line of a log or of HTML."""
    if not s or not isinstance(s, str):
        return s
    if _maybe(s):
        low = s.lower()
        word = _word_rx().search(s) is not None
        for needs, rx, repl, *also in _rules()[2]:
            if needs is _NEEDS_WORD:
                if word and all(any(c in low for c in group) for group in (also[0] if also else ())):
                    s = rx.sub(repl, s)
            elif any(n in low for n in needs):
                s = rx.sub(repl, s)
    for rx in _extra:
        s = rx.sub(MASK, s)
    return s


# An argv element that is an option, not the value of the option before it: --lr, --out=x, -v, --
_ARG_OPTION = re.compile(r"--[A-Za-z][A-Za-z0-9_.\-]*(?:=.*)?|-[A-Za-z]|--", re.DOTALL)


def argv(args: Iterable[str]) -> list[str]:
    """Redact an argv list element by element (a value may be the element after its option)."""
    out: list[str] = []
    pending: str | None = None         # the option whose value the next element is
    for a in args:
        if pending is not None:
            name, pending = pending, None
            if not _ARG_OPTION.fullmatch(a):
                out.append(_masked(a) if _secret(name, a) else text(a))
                continue
        if not _maybe(a):              # no rule can match without a hint
            out.append(text(a))
            continue
        if a == "-p":
            pending = "-p"
            out.append(a)
            continue
        opt_only, arg_pair, _ = _rules()
        m = arg_pair.match(a)
        if m:
            v = m.group(4)
            out.append(f"{m.group(1) or ''}{m.group(2)}={MASK if _secret(m.group(2), v) else v}")
            continue
        if a.startswith("-") and opt_only.match(a):
            pending = a.lstrip("-")
        out.append(text(a))
    return out


class _Walk:
    """Redacts a JSON-like value. A string or key seen before is looked up, not redacted again (a
    trace repeats each frame name and each key thousands of times)."""

    def __init__(self) -> None:
        self.memo: dict[str, str] = {}
        self.keys: dict[str, tuple[str, bool]] = {}
        self.changed = False

    def str(self, s: str) -> str:
        r = self.memo.get(s)
        if r is None:
            r = self.memo[s] = text(s)
        if r is not s and r != s:
            self.changed = True
        return r

    def value(self, obj: Any) -> Any:
        t = type(obj)
        if t is str:
            return self.str(obj)
        if t is dict or isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                if type(k) is str:
                    known = self.keys.get(k)
                    if known is None:
                        known = self.keys[k] = (self.str(k), is_credential_name(k))
                    elif known[0] != k:
                        self.changed = True
                    k, cred = known
                    if cred and type(v) in (str, int, float) and _secret(k, v if type(v) is str else str(v)):
                        out[k] = MASK
                        self.changed = True
                        continue
                tv = type(v)
                out[k] = v if tv is int or tv is float or v is None or tv is bool else self.value(v)
            return out
        if t is list or isinstance(obj, (list, tuple)):
            return [self.value(v) for v in obj]
        return obj


def value(obj: Any) -> Any:
    """Redact every string (and every key) inside a JSON-like value, and the string or number
    under a key that names a credential ({"password": "x"} -> {"password": "***"})."""
    return _Walk().value(obj)


# A document at least this large is redacted in place (`_splice`), not parsed and written again.
SPLICE_MIN_CHARS = 64 * 1024
_JSON_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def json_text(s: str) -> str:
    """Redact a JSON document string by string (so escaped quotes cannot hide a value); text that is
    not JSON is redacted as free text."""
    if len(s) >= SPLICE_MIN_CHARS and not _extra:
        out = _splice(s)                # its own hint search stands for the prefilter
        if out is not None:
            return out
    if not _maybe(s) and not any(rx.search(s) for rx in _extra):
        return s
    try:
        doc = json.loads(s)
    except (ValueError, RecursionError):
        return text(s)
    w = _Walk()
    red = w.value(doc)
    if not w.changed:
        return s
    return json.dumps(red)


def _quote(s: str, i: int, step: int) -> int:
    """The index of the first unescaped `"` from `i` on (step 1) or before `i` (step -1), or -1."""
    while True:
        i = s.find('"', i) if step > 0 else s.rfind('"', 0, i)
        if i < 0:
            return -1
        k = i
        while k > 0 and s[k - 1] == "\\":
            k -= 1
        if (i - k) % 2 == 0:
            return i
        i = i + 1 if step > 0 else i


def _splice(s: str) -> str | None:
    """A large JSON document (a py-spy trace: megabytes that repeat a few thousand strings)
    redacted in place: only the string literals that hold a hint are decoded, redacted (as
    `_Walk` does: the string itself, and the value after a key that names a credential) and
    written back; the rest is not parsed. Every hint lies inside a string literal of valid JSON
    (outside them are only numbers, punctuation, true, false and null), so the nearest unescaped
    quotes around a hint are the literal's own. None when `s` is not plain ASCII JSON or a literal
    does not decode: the caller parses it instead."""
    head = s[:1] if s[:1] in "[{" else s.lstrip()[:1]
    if head not in ("[", "{") or not s.isascii():
        return None
    low = s.lower()
    at: set[int] = set()
    for h in _HINTS:
        i = low.find(h)
        while i >= 0:
            at.add(i)
            i = low.find(h, i + 1)
    at.update(m.start() for m in _GH.finditer(low))
    i = low.find('"-p')                     # a string that starts with -p
    while i >= 0:
        at.add(i + 1)
        i = low.find('"-p', i + 1)
    if not at:
        return s
    memo: dict[str, str] = {}
    edits: list[tuple[int, int, str]] = []
    end = -1
    for p in sorted(at):
        if p <= end:
            continue
        q0 = _quote(s, p, -1)
        q1 = _quote(s, p, 1)
        if q0 < 0 or q1 < 0:
            return None
        lit = s[q0:q1 + 1]
        try:
            dec = json.loads(lit)
        except ValueError:
            return None
        end = q1
        red = memo.get(dec)
        if red is None:
            red = memo[dec] = text(dec)
        if red != dec:
            edits.append((q0, q1 + 1, json.dumps(red)))
        # A key that names a credential: the value after it, a string or a number, is hidden.
        j = q1 + 1
        while j < len(s) and s[j] in " \t\r\n":
            j += 1
        if j >= len(s) or s[j] != ":" or not is_credential_name(dec):
            continue
        j += 1
        while j < len(s) and s[j] in " \t\r\n":
            j += 1
        if s[j:j + 1] == '"':
            v1 = _quote(s, j + 1, 1)
            if v1 < 0:
                return None
            try:
                v = json.loads(s[j:v1 + 1])
            except ValueError:
                return None
            if _secret(red, v):
                edits.append((j, v1 + 1, json.dumps(MASK)))
                end = v1
        else:
            m = _JSON_NUMBER.match(s, j)
            if m and _secret(red, m.group(0)):
                edits.append((j, m.end(), json.dumps(MASK)))
    if not edits:
        return s
    out, last = [], 0
    for a, b, r in edits:
        out += [s[last:a], r]
        last = b
    out.append(s[last:])
    return "".join(out)


def artifact(name: str, s: str) -> str:
    """Redact one raw artifact a probe records, by its kind (JSON, JSON lines, text)."""
    if not isinstance(s, str):
        return s
    if name.endswith(".json"):
        return json_text(s)
    if name.endswith(".jsonl"):
        return "\n".join(json_text(ln) if ln.strip() else ln for ln in s.split("\n"))
    return text(s)
