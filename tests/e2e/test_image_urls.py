"""http(s) image URLs (issue 26), off by default: `sluice serve --allowed-media-domains 127.0.0.1`
fetches images from a local HTTP server and answers as with the same image inline (the
reference greedy tokens); a host off the allow-list (also as a redirect target), too many
redirects, a body over --max-image-bytes (declared or streamed), a fetch over the timeout and an
HTTP error are each a 400 naming the problem, and the server keeps serving."""

import http.server
import threading
import time

import openai
import pytest
from tokenizers import Tokenizer

from conftest import ServerProcess
from llava_tiny import FIXTURE, MAX_BYTES, want_text


class Handler(http.server.BaseHTTPRequestHandler):
    image = b""

    def log_message(self, *args):
        pass

    def send_body(self, body, length=None):
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def redirect(self, location):
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        port = self.server.server_address[1]
        if self.path == "/image_0.png":
            self.send_body(self.image)
        elif self.path.startswith("/redirect/"):  # /redirect/N: N hops to the image
            n = int(self.path.rsplit("/", 1)[1])
            self.redirect("/image_0.png" if n <= 1 else f"/redirect/{n - 1}")
        elif self.path == "/offsite":  # the same server under a name not on the allow-list
            self.redirect(f"http://localhost:{port}/image_0.png")
        elif self.path == "/big.png":
            self.send_body(b"\x89PNG" + b"\0" * (2 * MAX_BYTES))
        elif self.path == "/lying.png":  # claims a small size, then sends more: cut at the limit
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"\0" * 8192
            try:
                for _ in range(40):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass
        elif self.path == "/slow.png":
            time.sleep(3)
            try:
                self.send_body(self.image)
            except OSError:
                pass
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()


@pytest.fixture(scope="module")
def image_host():
    Handler.image = (FIXTURE / "image_0.png").read_bytes()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def vl_fetching():
    proc = ServerProcess(
        extra_args=["--allowed-media-domains", "127.0.0.1", "--media-fetch-timeout-s", "1",
                    "--media-max-redirects", "2", "--max-image-bytes", str(MAX_BYTES),
                    "--max-model-len", "256"],
        model_dir=FIXTURE)
    yield openai.OpenAI(base_url=proc.url + "/v1", api_key="sk-unused", max_retries=0,
                        timeout=60)
    assert proc.stop() == 0, proc.logs()


def ask(client, url):
    return client.chat.completions.create(
        model="llava-tiny", temperature=0, max_tokens=32, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is in this picture?"}]}])


@pytest.fixture(scope="module")
def want():
    return want_text(Tokenizer.from_file(str(FIXTURE / "tokenizer.json")), 0)


@pytest.mark.parametrize("path", ["/image_0.png", "/redirect/2"], ids=["direct", "2-redirects"])
def test_fetched_image_gives_the_reference_tokens(vl_fetching, image_host, want, path):
    assert ask(vl_fetching, image_host + path).choices[0].message.content == want


@pytest.mark.parametrize("path,fragment", [
    ("/redirect/3", "redirected more than 2 times"),
    ("/offsite", "the host 'localhost' (redirected to) is not in --allowed-media-domains"),
    ("/big.png", f"over the limit of {MAX_BYTES} bytes"),
    ("/lying.png", f"over the limit of {MAX_BYTES} bytes"),
    ("/slow.png", "took longer than 1s"),
    ("/missing.png", "answered HTTP 404"),
], ids=["too-many-redirects", "redirect-off-the-list", "declared-too-big", "streamed-too-big",
        "timeout", "not-found"])
def test_fetch_problems_are_400s(vl_fetching, image_host, want, path, fragment):
    with pytest.raises(openai.BadRequestError) as err:
        ask(vl_fetching, image_host + path)
    assert err.value.status_code == 400
    assert "cannot fetch the image URL" in err.value.message, err.value.message
    assert fragment in err.value.message, err.value.message
    assert ask(vl_fetching, image_host + "/image_0.png").choices[0].message.content == want


def test_host_off_the_allow_list_is_not_contacted(vl_fetching, image_host):
    port = image_host.rsplit(":", 1)[1]
    with pytest.raises(openai.BadRequestError) as err:
        ask(vl_fetching, f"http://localhost:{port}/image_0.png")
    assert "the host 'localhost' is not in --allowed-media-domains" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        ask(vl_fetching, f"ftp://127.0.0.1:{port}/image_0.png")
    assert "base64 data URL" in err.value.message
