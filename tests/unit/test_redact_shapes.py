"""The shapes of credentials trainprobe hides, and the look-alikes it keeps: one table of
input -> expected output for free text, one for argv lists, and the JSON forms."""
from __future__ import annotations

import json

import pytest

from trainprobe.probes.parsers import procfs, redact

GH = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
GH_PAT = "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
OPENAI = "sk-proj-" + "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0"
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
SLACK = "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOp"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"

# input -> expected output of redact.text
HIDDEN = [
    # option names: longer names, plurals, = and space forms
    ("--passphrase=S1", "--passphrase=***"),
    ("--pass S2", "--pass ***"),
    ("--db-pass=S3", "--db-pass=***"),
    ("--authorization=S4", "--authorization=***"),
    ("--tokens=S5", "--tokens=***"),
    ("--bearer S6", "--bearer ***"),
    ("--api-keys=S8", "--api-keys=***"),
    ("--secrets=S9", "--secrets=***"),
    ("--passwords=S10", "--passwords=***"),
    ("--cookies=S11", "--cookies=***"),
    ("--password -x9Secret", "--password ***"),
    ("--credential S12", "--credential ***"),
    ("--credentials=S13", "--credentials=***"),
    ("--private_key S14", "--private_key ***"),
    ("--access_key=S15", "--access_key=***"),
    ("--signature S16", "--signature ***"),
    ("--hf-token S17 --lr 0.1", "--hf-token *** --lr 0.1"),
    ("--api-key 'S18 with space'", "--api-key '***'"),
    ("db_password=S19", "db_password=***"),
    ("MY_SERVICE_TOKEN=S20", "MY_SERVICE_TOKEN=***"),
    ("PGPASSWORD=S21 psql", "PGPASSWORD=*** psql"),
    ("sessionid=S22", "sessionid=***"),
    ("--session S23", "--session ***"),
    ("trainer.wandb.api_key=S24", "trainer.wandb.api_key=***"),
    # counts against secrets: a number after a secret word stays a secret
    ("--token 42", "--token ***"),
    ("--password 123456", "--password ***"),
    ("--api-key 1234", "--api-key ***"),
    ("--tokens=abc123", "--tokens=***"),
    # -p: hidden unless a port-like number
    ("-p S25", "-p ***"),
    ("mysql -u root -phunter2", "mysql -u root -p***"),
    ("-p 1234567", "-p ***"),
    # headers
    ('--header "Authorization: Bearer S26"', '--header "Authorization: Bearer ***"'),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
    ("Authorization: S27", "Authorization: ***"),
    ("Cookie: a=S28; b=S29", "Cookie: ***"),
    ("Set-Cookie: sid=S30; Path=/", "Set-Cookie: ***"),
    ("x-api-key: S31", "x-api-key: ***"),
    ("got Bearer S32abcdefgh back", "got Bearer *** back"),
    # JSON, Python and YAML forms
    ('--conf={"password": "S33"}', '--conf={"password": "***"}'),
    ('{"max_tokens": 512, "api_key": "S34"}', '{"max_tokens": 512, "api_key": "***"}'),
    ("{'secret': 'S35', 'lr': 0.1}", "{'secret': '***', 'lr': 0.1}"),
    ('cfg={\\"password\\": \\"S36\\"}', 'cfg={\\"password\\": \\"***\\"}'),
    ("api_key: S37", "api_key: ***"),
    ("  password: S38  # prod", "  password: ***  # prod"),
    ('    api_token = "S39"  # x', '    api_token = "***"  # x'),
    ('--secrets={"a": "S40", "b": 2}', "--secrets=***"),
    # URLs: user-info and query parameters
    ("https://alice:S41@hub.example/x", "https://***@hub.example/x"),
    ("https://acct.blob.core.windows.net/c/f?sv=2022-11-02&sig=S42&se=2030",
     "https://acct.blob.core.windows.net/c/f?sv=2022-11-02&sig=***&se=2030"),
    ("https://h/x?token=S43&page=2", "https://h/x?token=***&page=2"),
    ("https://s3/x?X-Amz-Credential=S44&X-Amz-Signature=S45",
     "https://s3/x?X-Amz-Credential=***&X-Amz-Signature=***"),
    ("wss://h/ws?access_token=S46", "wss://h/ws?access_token=***"),
    # well-known token formats anywhere, the prefix kept
    (f"clone with {GH} now", "clone with ghp_*** now"),
    (f"pat {GH_PAT}", "pat github_pat_***"),
    (f"thread loader {HF}", "thread loader hf_***"),
    (f"key is {OPENAI}.", "key is sk-***."),
    (f"id {AWS}", "id AKIA***"),
    (f"slack {SLACK}", "slack xoxb-***"),
    (f"jwt={JWT}", "jwt=eyJ***"),
    (f"got {JWT} from idp", "got eyJ*** from idp"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
     "-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----"),
]

# Not secrets: kept exactly.
KEPT = [
    "--num-workers 8", "--lr 0.1", "--tokenizer gpt2", "--max-tokens 512", "--max_new_tokens=256",
    "--key-frames 3", "--passes 2", "--compass", "--bypass-cache", "--output_dir /tmp/x", "--batch-size 32",
    "tokens=5", "tokens_per_batch=4096", "--num-keys 16", "--num-sessions 2", "maxTokens=2048",
    "author=me", "--keyboard 3", "-p 8", "-p 29500", "mkdir -pv /tmp/x", "if key == 3:",
    "--use_auth_token --output_dir /x", "process 1018:\"python3 train.py fixed 16\"",
    "torch/utils/data/dataloader.py", "tokenization_utils_base.py:__call__", "https://hub.example/org/model",
    "sk-learn", "hf_hub_download", "Thread._bootstrap",
]


@pytest.fixture(autouse=True)
def _no_extra_patterns():
    yield
    redact.configure(())


@pytest.mark.parametrize("given, expected", HIDDEN)
def test_credential_shapes_are_hidden(given, expected):
    assert redact.text(given) == expected
    assert redact.text(expected) == expected, "redaction is idempotent (a bundle is redacted again when read)"
    assert redact._maybe(given), "the prefilter lets every shape through"


@pytest.mark.parametrize("plain", KEPT)
def test_look_alikes_are_kept(plain):
    assert redact.text(plain) == plain


def test_the_table_is_large_enough():
    assert len(HIDDEN) + len(KEPT) >= 40 and len(KEPT) >= 10


# argv lists: the value may be the next element, which may start with `-`
ARGV = [
    (["t.py", "--password", "-x9Secret", "--lr", "0.1"], ["t.py", "--password", "***", "--lr", "0.1"]),
    (["t.py", "--pass", "S1"], ["t.py", "--pass", "***"]),
    (["t.py", "--bearer", "S2"], ["t.py", "--bearer", "***"]),
    (["t.py", "-p", "S3"], ["t.py", "-p", "***"]),
    (["t.py", "-p", "8"], ["t.py", "-p", "8"]),
    (["t.py", "-p", "99999"], ["t.py", "-p", "***"]),
    (["t.py", "-phunter2"], ["t.py", "-p***"]),
    (["t.py", "--header", "Authorization: Bearer S4"], ["t.py", "--header", "Authorization: Bearer ***"]),
    (["t.py", "-H", "Cookie: sid=S5"], ["t.py", "-H", "Cookie: ***"]),
    (["t.py", '--conf={"password": "S6", "lr": 0.1}'], ["t.py", '--conf={"password": "***", "lr": 0.1}']),
    (["t.py", "--secrets={\"a\": \"S7\"}"], ["t.py", "--secrets=***"]),
    (["t.py", "--api-key", "S8 with space"], ["t.py", "--api-key", "***"]),
    (["t.py", "--max-tokens", "512", "--token", "512"], ["t.py", "--max-tokens", "512", "--token", "***"]),
    (["t.py", "--use_auth_token", "--output_dir", "/x"], ["t.py", "--use_auth_token", "--output_dir", "/x"]),
    (["t.py", "--hf-token", "-v"], ["t.py", "--hf-token", "-v"]),
    (["t.py", "--tokenizer", "gpt2", "--passes", "2", "--key-frames", "3"],
     ["t.py", "--tokenizer", "gpt2", "--passes", "2", "--key-frames", "3"]),
    (["t.py", f"--x={HF}"], ["t.py", "--x=hf_***"]),
]


@pytest.mark.parametrize("given, expected", ARGV)
def test_argv_shapes(given, expected):
    assert redact.argv(given) == expected
    raw = "\0".join(given).encode()
    assert procfs.parse_argv(raw) == expected
    assert redact.text(" ".join(expected)) == " ".join(expected)


@pytest.mark.parametrize("word", ["key", "token", "secret", "password", "pass", "auth", "authorization",
                                  "bearer", "credential", "cookie", "session", "signature", "passphrase"])
def test_every_credential_word_in_every_form(word):
    plural = () if word in ("pass", "auth") else (f"{word}s",)
    for name in (word, word.upper(), f"db_{word}", f"MY_SERVICE_{word.upper()}", f"x-{word}", *plural):
        out = redact.text(f"--{name}=V4LUE --{name} V4LUE {name}=V4LUE {name}: V4LUE")
        assert "V4LUE" not in out, (name, out)
        assert redact.argv([f"--{name}", "V4LUE"]) == [f"--{name}", "***"], name


def test_a_dict_entry_named_like_a_credential_is_hidden():
    doc = {"password": "hunter2", "db": {"api_key": 12345678, "max_tokens": 512, "tokens": 3},
           "session_notes": ["kept"], "name": "ok", "flags": [True, None]}
    assert redact.value(doc) == {"password": "***", "db": {"api_key": "***", "max_tokens": 512, "tokens": 3},
                                 "session_notes": ["kept"], "name": "ok", "flags": [True, None]}
    out = redact.json_text(json.dumps(doc))
    assert "hunter2" not in out and "12345678" not in out and json.loads(out)["db"]["max_tokens"] == 512


def test_json_lines_artifacts_are_redacted_line_by_line():
    lines = [json.dumps({"threads": [{"thread_name": 'w --auth-token=\\"S1\\"'}]}), "", json.dumps({"ok": 1})]
    out = redact.artifact("gil_samples.jsonl", "\n".join(lines))
    assert "S1" not in out
    assert [json.loads(x) for x in out.split("\n") if x][1] == {"ok": 1}


def test_an_unchanged_json_document_is_returned_as_given():
    s = json.dumps([{"name": "tokenize (tokenization_utils_base.py:3)", "args": {"line": 3}}], indent=1)
    assert redact.json_text(s) is s


def _random_docs(n: int):
    import random
    rnd = random.Random(3)
    strs = [g for g, _ in HIDDEN] + KEPT + ["password", "api_key", "*** key=S1", 'a\\"b --token X', 'tok"en=1',
                                            "-p S2", "-P s3cret"]
    keys = strs + ["name", "args", "password", "tokens", "max_tokens", "session_notes", "x-api-key"]

    def rv(d: int = 0):
        c = rnd.random()
        if d > 3 or c < 0.4:
            return rnd.choice(strs)
        if c < 0.5:
            return rnd.choice([512, 3.5, -1, True, None, "512", 12345678])
        if c < 0.75:
            return [rv(d + 1) for _ in range(rnd.randint(0, 4))]
        return {rnd.choice(keys): rv(d + 1) for _ in range(rnd.randint(0, 4))}
    for _ in range(n):
        yield [rv() for _ in range(rnd.randint(1, 5))]


def test_a_large_document_redacted_in_place_reads_as_the_parsed_one():
    """`_splice` (large documents, only the literals holding a hint are touched) gives the document
    the parse-and-walk path gives, on random documents of the table's strings and on a real trace."""
    from tests.helpers import h200_chrometrace
    n = 0
    for doc in _random_docs(100):
        for indent in (None, 1):
            s = json.dumps(doc, indent=indent)
            spliced = redact._splice(s)
            assert spliced is not None
            assert json.loads(spliced) == redact.value(json.loads(s)), s
            n += 1
    assert n == 200
    trace = h200_chrometrace("healthy")
    assert len(trace) >= redact.SPLICE_MIN_CHARS
    assert redact.json_text(trace) is trace
    planted = trace.replace('"name":"', '"name":"--api-key=PLANTED1 Authorization: Bearer PLANTED2 ', 3)
    out = redact.json_text(planted)
    assert "PLANTED" not in out and json.loads(out) == redact.value(json.loads(planted))
    assert redact._splice('{"a": "\\u00e9 --token X"}') is not None
    assert redact._splice("not json --token X") is None
    assert redact._splice('["unterminated --token X') is None


def test_a_credential_words_rules_run_only_where_their_punctuation_is():
    """Each NAME rule needs its punctuation (`=`, `:`, a quote, a dash) to match at all: a text
    without it neither runs nor compiles the rule (each takes 1.2-1.7 ms to compile), and every form
    is still hidden."""
    rules = redact._rules()[2]
    for r in rules:
        r[1]._rx = None                    # as before their first use (each compiles again on demand)
    assert redact.text("systemd --auth-required") == "systemd --auth-required"
    assert sum(r[1]._rx is not None for r in rules) == 1          # the option rule alone
    for s, out in [("--token abc", "--token ***"), ("TOKEN=abc", "TOKEN=***"), ("token: abc", "token: ***"),
                   ('{"token": "abc"}', '{"token": "***"}'), ("Authorization: Bearer abc", "Authorization: Bearer ***"),
                   ("Cookie: a=b", "Cookie: ***")]:
        assert redact.text(s) == out, s
