"""URL patterns of the REST API; ``dashboard/urls.py`` mounts them at /api/.

Two things are added around ninja's patterns so that every answer under /api/ is the JSON
error envelope: a wrong method (405, ninja answers plain text) and an unknown path (404,
Django would answer its HTML page).
"""

import functools

from django.http import HttpResponseNotAllowed, JsonResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt

from dashboard.api.app import api
from dashboard.api.core import error_body


def _json_405(view):
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        if isinstance(response, HttpResponseNotAllowed):
            allowed = response["Allow"]
            response = JsonResponse(
                error_body(
                    "method_not_allowed", f"{request.method} is not allowed here; use {allowed}"
                ),
                status=405,
            )
            response["Allow"] = allowed
        return response

    wrapper.csrf_exempt = True
    return wrapper


@csrf_exempt
def not_found(request, rest=""):
    return JsonResponse(
        error_body("not_found", f"no API endpoint at {request.path}; see /api/docs"),
        status=404,
        json_dumps_params={"ensure_ascii": False},
    )


_patterns, _app, namespace = api.urls
for _pattern in _patterns:
    if _pattern.name == "api-root":
        # ninja's /api/ either redirects to the docs (DEBUG) or raises an HTML 404.
        _pattern.callback = not_found
    else:
        _pattern.callback = _json_405(_pattern.callback)


app_name = "api"
urlpatterns = [*_patterns, re_path(r"^(?P<rest>.*)$", not_found)]
