// Issue 24: the run page's conclusion card (SPEC §9 Conclusions), redrawn when a
// `conclusion` event streams in. The server renders the first view; this keeps it current.
import { el } from "./common.js";

function fill(list, items, render) {
  list.replaceChildren(...items.map((item) => el("li", {}, ...render(item))));
}

function artifactParts(artifact, cwd) {
  // Only http(s) URLs pass the server's schema; a path is a file in the run's workspace.
  const target = artifact.url
    ? el("a", { href: artifact.url, rel: "noopener noreferrer nofollow", target: "_blank" }, artifact.url)
    : el("code", { title: `a file in the run's workspace${cwd ? ` (${cwd})` : ""}` }, artifact.path || "");
  return [target, ` — ${artifact.description}`];
}

export function showConclusion(card, conclusion) {
  if (!card || !conclusion) return;
  card.hidden = false;
  const status = card.querySelector("[data-field=conclusion-status]");
  status.textContent = conclusion.status;
  status.className = `mark conclusion-mark conclusion-${conclusion.status}`;
  card.querySelector("[data-field=conclusion-summary]").textContent = conclusion.summary;
  const artifacts = card.querySelector("[data-role=conclusion-artifacts]");
  artifacts.hidden = !conclusion.artifacts?.length;
  fill(artifacts.querySelector("ul"), conclusion.artifacts || [], (a) => artifactParts(a, card.dataset.cwd));
  const followUp = card.querySelector("[data-role=conclusion-follow-up]");
  followUp.hidden = !conclusion.followUp?.length;
  fill(followUp.querySelector("ul"), conclusion.followUp || [], (item) => [item]);
  const confidence = card.querySelector("[data-role=conclusion-confidence]");
  confidence.hidden = typeof conclusion.confidence !== "number";
  if (!confidence.hidden) {
    card.querySelector("[data-field=conclusion-confidence]").textContent = `${Math.round(conclusion.confidence * 100)}%`;
  }
}
