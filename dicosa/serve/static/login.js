// The login form keeps the page the browser came from (?next=) and says when a key failed.
"use strict";
const params = new URLSearchParams(location.search);
document.getElementById("next").value = params.get("next") || "/";
document.getElementById("failed").hidden = params.get("failed") !== "1";
