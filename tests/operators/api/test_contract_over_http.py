"""What a client written from the contract meets through a real daphne (issue 25): a body of
any content type is answered in the ``{"error": ...}`` envelope, after the auth rules."""

from __future__ import annotations

import httpx2
import pytest

from tests.support.personas import api_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

# A multipart content type without its boundary: Twisted used to parse this itself and
# answer a bare, empty 400 before Django (and authentication) saw the request.
MULTIPART = [
    "multipart/form-data",
    "multipart/form-data; boundary=x",
]
BODY = b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\nb\r\n--x--\r\n'


@pytest.mark.parametrize("content_type", MULTIPART)
def test_it_answers_a_multipart_post_in_the_error_envelope_after_auth(
    daphne_server, operator, content_type
):
    url = f"{daphne_server.http_url}/api/runs/nope/cancel"
    anonymous = httpx2.post(url, content=BODY, headers={"Content-Type": content_type})
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "unauthenticated"
    signed = httpx2.post(
        url,
        content=BODY,
        headers={
            "Content-Type": content_type,
            "Authorization": f"Bearer {api_token(operator)}",
        },
    )
    assert signed.status_code == 400, signed.content
    error = signed.json()["error"]
    assert error["code"] == "bad_request" and error["message"].startswith("body: ")
