"""Number formats for zh-Hans pages, over Django's own (which group by 10,000 with no separator).

Mainland business documents, invoices and exchanges group by thousands with a comma (12,800 张卡), as the
English pages do; the portal's ``count`` and ``money`` filters read these. Dates stay ISO (the templates ask
for ``Y-m-d``) so a time reads the same in both languages.
"""

THOUSAND_SEPARATOR = ","
NUMBER_GROUPING = 3
DECIMAL_SEPARATOR = "."
