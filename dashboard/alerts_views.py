"""The admins' alerts page (issue 25): webhooks, a form to add one, *send test*, and the
recent deliveries with every attempt. Everything goes through ``delegation.services.alerts``
(which checks the admin role and audits); reads through ``delegation.selectors``."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from dashboard.views import _actor, _context, _refuse, _refused, viewer_required
from delegation import roles, selectors
from delegation.errors import PermissionRefused, RpcError
from delegation.models import ALERT_KINDS, Webhook
from delegation.services import alerts


def _admin_only(request):
    if not roles.can_admin(request.user):
        return _refuse(
            request,
            f"{request.user.get_username()} is not an admin; alerts and webhooks need admin.",
        )
    return None


@require_GET
@viewer_required
def alerts_page(request):
    refused = _admin_only(request)
    if refused is not None:
        return refused
    return render(
        request,
        "alerts.html",
        _context(request, kinds=ALERT_KINDS, **selectors.alerts_overview()),
    )


@require_POST
@viewer_required
def webhook_create(request):
    try:
        created = alerts.do_create_webhook(
            _actor(request),
            url=request.POST.get("url", ""),
            kinds=request.POST.getlist("kinds"),
            name=request.POST.get("name", "").strip(),
        )
    except (PermissionRefused, RpcError) as exc:
        return _refused(request, exc)
    # Shown once, as REST shows it once: the receiver needs it to verify signatures.
    messages.success(
        request,
        f"Webhook {created.webhook.pk} saved. Its signing secret (shown once): {created.secret}",
    )
    return redirect("alerts")


@require_POST
@viewer_required
def webhook_test(request, pk: int):
    hook = Webhook.objects.filter(pk=pk).first()
    if hook is None:
        return _refuse(request, f"No webhook {pk}.", status=404)
    try:
        delivery = alerts.do_send_test(_actor(request), hook)
    except (PermissionRefused, RpcError) as exc:
        return _refused(request, exc)
    messages.success(
        request, f"Test delivery {delivery.delivery_id} stored; it is sent within a sweep."
    )
    return redirect("alerts")
