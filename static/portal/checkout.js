// Cardhour checkout: the live total of the buy form, and paying an order with Stripe Elements.
// The pages work without it (the total is shown before paying on the checkout page, the test-mode card
// form is a plain form); Stripe's card form itself needs JavaScript.
(function () {
  "use strict";

  // --- The buy form: total = price of the chosen pack × quantity, in fen to stay exact. -----------------
  function toFen(text) {
    var match = /^(\d+)(?:\.(\d{1,2}))?$/.exec(String(text).trim());
    if (!match) { return null; }
    return parseInt(match[1], 10) * 100 + parseInt(((match[2] || "") + "00").slice(0, 2), 10);
  }
  function formatFen(fen, currency) {
    var yuan = Math.floor(fen / 100).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
    var text = yuan + "." + ("0" + (fen % 100)).slice(-2);
    return currency === "CNY" ? "¥" + text : text + " " + currency;
  }
  document.querySelectorAll("[data-buy-form]").forEach(function (form) {
    var output = form.querySelector("[data-buy-total]");
    var quantity = form.querySelector("input[name=quantity]");
    if (!output || !quantity) { return; }
    function update() {
      var chosen = form.querySelector("input[name=product]:checked");
      var price = chosen ? toFen(chosen.getAttribute("data-price")) : null;
      var count = /^\d+$/.test(quantity.value.trim()) ? parseInt(quantity.value, 10) : 0;
      var max = parseInt(quantity.getAttribute("max") || "0", 10);
      if (price === null || count < 1 || (max && count > max)) {
        output.textContent = "—";
        return;
      }
      output.textContent = formatFen(price * count, output.getAttribute("data-currency") || "CNY");
    }
    form.addEventListener("change", update);
    form.addEventListener("input", update);
    update();
  });

  // Any checkout form: one submit only (a double click would confirm twice).
  document.querySelectorAll("[data-test-checkout]").forEach(function (form) {
    form.addEventListener("submit", function () {
      var button = form.querySelector("button[type=submit]");
      if (button) { window.setTimeout(function () { button.disabled = true; }, 0); }
    });
  });

  // The order summary's status badge follows the polled payment status (portal.js or the poll below
  // replace the status fragment; the fragment names the order's status).
  var badge = document.getElementById("order-status");
  if (badge && window.MutationObserver) {
    var observer = new MutationObserver(function (mutations) {
      var mark = mutations[0].target.querySelector("[data-order-status-label]");
      if (mark) {
        badge.textContent = mark.getAttribute("data-order-status-label");
        badge.className = mark.getAttribute("data-order-status-class");
      }
    });
    document.querySelectorAll("[data-poll-url], #checkout-waiting").forEach(function (el) {
      observer.observe(el, { childList: true });
    });
  }

  // --- Stripe Elements: confirm the PaymentIntent in the browser, then wait for the webhook. -----------
  var form = document.querySelector("[data-checkout]");
  if (!form) { return; }
  var errors = document.getElementById("card-errors");
  var button = document.getElementById("pay-button");
  var waiting = document.getElementById("checkout-waiting");

  function showError(message) {
    errors.textContent = message;
    errors.hidden = false;
  }

  if (typeof window.Stripe !== "function") {
    showError(form.getAttribute("data-error-unavailable"));
    button.disabled = true;
    return;
  }
  // Stripe.js words its own card errors in the page's language, not only the browser's.
  var stripe = window.Stripe(form.getAttribute("data-publishable-key"), {
    locale: form.getAttribute("data-stripe-locale") || "auto"
  });
  var card = stripe.elements().create("card", { hidePostalCode: true });
  card.mount("#card-element");
  card.on("change", function (event) {
    // Stripe reports an incomplete or invalid number as the buyer types.
    if (event && event.error) { showError(event.error.message); }
    else if (event) { errors.hidden = true; }
  });

  // Poll the order's status fragment until it carries data-poll-done (the webhook credited the pack or
  // failed the order), as portal.js does for server-rendered pending pages.
  function poll(url) {
    fetch(url, { headers: { "X-Requested-With": "fetch" }, credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html !== null) {
          var holder = document.createElement("div");
          holder.innerHTML = html;
          var fresh = holder.firstElementChild;
          if (fresh) {
            waiting.innerHTML = fresh.innerHTML;
            if (fresh.hasAttribute("data-poll-done")) { return; }
          }
        }
        window.setTimeout(function () { poll(url); }, 2000);
      })
      .catch(function () { window.setTimeout(function () { poll(url); }, 8000); });
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    if (button.disabled) { return; }
    button.disabled = true;
    errors.hidden = true;
    stripe.confirmCardPayment(form.getAttribute("data-client-secret"), { payment_method: { card: card } })
      .then(function (result) {
        if (result.error) {
          // A declined card, a wrong CVC...: Stripe's own message; the same PaymentIntent takes another card.
          showError(result.error.message || form.getAttribute("data-error-generic"));
          button.disabled = false;
          card.focus();
          return;
        }
        // Stripe took the payment: say so, and wait for the webhook (the status URL is told the browser
        // saw the payment succeed, so an earlier decline on the order does not end the wait).
        form.hidden = true;
        waiting.hidden = false;
        waiting.setAttribute("tabindex", "-1");
        waiting.focus();
        poll(form.getAttribute("data-status-url") + "?confirmed=1");
      })
      .catch(function () {
        showError(form.getAttribute("data-error-generic"));
        button.disabled = false;
      });
  });
})();
