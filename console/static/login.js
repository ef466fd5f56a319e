// The sign-in form: posts the name and password as JSON (never in a URL), then opens the console.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login").addEventListener("submit", async ev => {
    ev.preventDefault();
    const error = document.getElementById("login-error");
    error.textContent = "";
    const response = await fetch("/api/login", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ name: document.getElementById("name").value, password: document.getElementById("password").value }),
    });
    if (response.ok) { window.location.assign("/"); return; }
    let message = `sign-in failed (${response.status})`;
    try { message = (await response.json()).error || message; } catch (_) { /* not JSON */ }
    error.textContent = message;
  });
});
