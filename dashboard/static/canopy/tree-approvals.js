// Deciding a run's oldest pending approval from its tree row (SPEC §11), through the same
// POST /api/approvals/{id}/decision the inbox uses: the server holds every rule (who may
// decide, what a deny carries); this only asks which approval and, for a deny, why.
const csrf = () => document.querySelector("[name=csrfmiddlewaretoken]")?.value ?? "";
const status = document.createElement("div");
status.className = "row-approval-outcome";
status.dataset.role = "row-approval-outcome";
status.setAttribute("role", "status");
document.body.append(status);

async function oldestPending(runId) {
  const query = new URLSearchParams({ status: "pending", run: runId, limit: "1" });
  const response = await fetch(`/api/approvals?${query}`, { credentials: "same-origin" });
  if (!response.ok) return null;
  return (await response.json()).items[0] ?? null;
}

async function decide(button) {
  const action = button.dataset.approvalAction;
  const body = { decision: action };
  if (action === "deny") {
    const message = window.prompt("Why (shown to the agent)?", "");
    if (message === null) return;
    if (message.trim()) body.message = message.trim();
  }
  button.disabled = true;
  const approval = await oldestPending(button.dataset.runId);
  if (approval === null) {
    status.textContent = `No pending approval on ${button.dataset.runId} any more.`;
    return;
  }
  const response = await fetch(`/api/approvals/${encodeURIComponent(approval.approvalId)}/decision`, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrf() },
    body: JSON.stringify(body),
  });
  const answer = await response.json();
  // The row's count follows over the live socket (the decision rings the tree's doorbell).
  status.textContent = response.ok
    ? `${approval.toolName} on ${approval.runId}: ${answer.decision} by ${answer.decidedBy}`
    : `Refused: ${answer.error?.message ?? response.status}`;
  button.disabled = false;
}

// Capture: the row's own click handler (select, open) must not also act on the button.
document.addEventListener(
  "click",
  (event) => {
    const button = event.target.closest?.("[data-approval-action]");
    if (!button) return;
    event.preventDefault();
    event.stopPropagation();
    decide(button);
  },
  true,
);
