"""The admins' alerts page (issue 25): webhooks, a form to add one, *send test*, and the
recent deliveries with every attempt. Everything goes through ``delegation.services.webhooks``
(which checks the admin role and audits); reads through ``delegation.selectors``."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from dashboard.views.base import actor_of, page_context, refuse, refused, viewer_required
from dashboard.views.form_errors import NUL_STATUS, nul_field, nul_message, refusal
from delegation import roles, selectors
from delegation.errors import PermissionRefused, RpcError
from delegation.models import ALERT_KINDS
from delegation.selectors import alerts as reads
from delegation.services import webhooks


def _admin_only(request):
    if not roles.can_admin(request.user):
        return refuse(
            request,
            f"{request.user.get_username()} is not an admin; alerts and webhooks need admin.",
        )
    return None


def _page(request, status: int = 200, **form):
    context = page_context(request, kinds=ALERT_KINDS, **selectors.alerts_overview())
    # What the add form shows: all kinds ticked at first, then what was typed (issue 38).
    context["form"] = form.get("form") or {"name": "", "url": "", "kinds": list(ALERT_KINDS)}
    context["form_error"] = form.get("error", "")
    context["form_error_field"] = form.get("field", "")
    return render(request, "alerts.html", context, status=status)


@require_GET
@viewer_required
def alerts_page(request):
    refused = _admin_only(request)
    if refused is not None:
        return refused
    return _page(request)


@require_POST
@viewer_required
def webhook_create(request):
    typed = {
        "name": request.POST.get("name", ""),
        "url": request.POST.get("url", ""),
        "kinds": request.POST.getlist("kinds"),
    }
    # The service checks the role (and audits a refusal) first; NUL is refused after it.
    if roles.can_admin(request.user) and (bad := nul_field({k: typed[k] for k in ("name", "url")})):
        return _page(request, NUL_STATUS, form=typed, error=nul_message(bad), field=bad)
    try:
        created = webhooks.do_create_webhook(
            actor_of(request), url=typed["url"], kinds=typed["kinds"], name=typed["name"].strip()
        )
    except PermissionRefused as exc:
        return refused(request, exc)
    except RpcError as exc:
        # The form again, with what was typed and the error beside its field.
        form, status = refusal(exc, ("name", "url", "kinds"))
        return _page(request, status, form=typed, **form)
    # Shown once, as REST shows it once: the receiver needs it to verify signatures.
    messages.success(
        request,
        f"Webhook {created.webhook.pk} saved. Its signing secret (shown once): {created.secret}",
    )
    return redirect("alerts")


@require_POST
@viewer_required
def webhook_test(request, pk: int):
    hook = reads.get_webhook(pk)
    if hook is None:
        return refuse(request, f"No webhook {pk}.", status=404)
    try:
        delivery = webhooks.do_send_test(actor_of(request), hook)
    except (PermissionRefused, RpcError) as exc:
        return refused(request, exc)
    messages.success(
        request, f"Test delivery {delivery.delivery_id} stored; it is sent within a sweep."
    )
    return redirect("alerts")


def _hook_or_refuse(request, pk: int):
    hook = reads.get_webhook(pk)
    return hook, (None if hook is not None else refuse(request, f"No webhook {pk}.", status=404))


@require_POST
@viewer_required
def webhook_active(request, pk: int):
    """Turn a webhook off (nothing is sent to it) or on again (issue 38)."""
    hook, missing = _hook_or_refuse(request, pk)
    if missing:
        return missing
    active = request.POST.get("active") == "1"
    try:
        webhooks.do_update_webhook(
            actor_of(request), hook, url=hook.url, kinds=hook.kinds, active=active, name=hook.name
        )
    except (PermissionRefused, RpcError) as exc:
        return refused(request, exc)
    messages.success(request, f"Webhook {hook.pk} turned {'on' if active else 'off'}.")
    return redirect("alerts")


@require_POST
@viewer_required
def webhook_delete(request, pk: int):
    """Delete a webhook and its deliveries (the audit entry keeps what it was)."""
    hook, missing = _hook_or_refuse(request, pk)
    if missing:
        return missing
    try:
        webhooks.do_delete_webhook(actor_of(request), hook)
    except (PermissionRefused, RpcError) as exc:
        return refused(request, exc)
    messages.success(request, f"Webhook {pk} deleted.")
    return redirect("alerts")
