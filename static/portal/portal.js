// Cardhour portal: small progressive enhancements. Every page works without this file.
(function () {
  "use strict";
  // On a phone the navigation is folded behind "Menu"; on a wide screen it is always open (also when the
  // window is resized or a phone is turned).
  var menu = document.querySelector(".nav-menu");
  var narrow = window.matchMedia("(max-width: 760px)");
  function fitMenu() {
    if (!menu) { return; }
    if (narrow.matches) { menu.removeAttribute("open"); } else { menu.setAttribute("open", ""); }
  }
  fitMenu();
  if (narrow.addEventListener) { narrow.addEventListener("change", fitMenu); }
  // Forms marked data-confirm ask before they submit (cancel a lease, revoke a token).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });
  // A select marked data-submit-on-change submits its form when changed (the organisation switch); an
  // inline onchange attribute would be refused by the Content-Security-Policy.
  document.querySelectorAll("select[data-submit-on-change]").forEach(function (select) {
    select.addEventListener("change", function () { select.form.submit(); });
  });
  // Elements with data-poll-url reload their content from that URL every data-poll-seconds (default 3)
  // until the response carries data-poll-done; used for pending payments and live usage.
  document.querySelectorAll("[data-poll-url]").forEach(function (el) {
    var seconds = parseFloat(el.getAttribute("data-poll-seconds") || "3");
    function tick() {
      fetch(el.getAttribute("data-poll-url"), { headers: { "X-Requested-With": "fetch" }, credentials: "same-origin" })
        .then(function (response) { return response.ok ? response.text() : null; })
        .then(function (html) {
          if (html === null) { return; }
          var holder = document.createElement("div");
          holder.innerHTML = html;
          var fresh = holder.firstElementChild;
          if (fresh) {
            el.innerHTML = fresh.innerHTML;
            if (fresh.hasAttribute("data-poll-done")) { return; }
          }
          window.setTimeout(tick, seconds * 1000);
        })
        .catch(function () { window.setTimeout(tick, seconds * 4000); });
    }
    window.setTimeout(tick, seconds * 1000);
  });
})();
