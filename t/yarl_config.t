#!/usr/bin/perl

# nginx -t accepts a full configuration and refuses each bad directive value with an
# [emerg] line that names the directive and the value.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl;

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
system("$FindBin::Bin/../scripts/make-test-ca.sh '" . $t->testdir . "' >/dev/null") == 0 or die "make-test-ca.sh failed\n";

sub conf {
	my ($http, $location) = @_;
	$location //= '';
	$t->write_http_conf(<<"EOF");
    $http
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        location / {
            $location
        }
    }
EOF
}

conf(<<'EOF', <<'EOF');
    yarl_roots http://127.0.0.1:7700 https://127.0.0.1:7701/;
    yarl_sync_ca %%TESTDIR%%/ca.pem;
    yarl_zone 8m;
    yarl_sync_interval 250ms;
    yarl_sync_timeout 1s;
    yarl_sync_token secret-token;
    yarl_sync_answers touched;
    map $request_method $type { default read; POST write; }
    yarl_check global;
EOF
            yarl_check "s3_${arg_bucket}_${type}";
            yarl_account app;
            yarl_account bytes $content_length;
            yarl_account fixed 10;
            yarl_status 503;
            yarl_dry_run on;
            yarl_log_level warn;
            yarl_retry_after off;
EOF
my ($rc, $out) = $t->test_config();
is($rc, 0, 'full configuration accepted') or diag($out);

my @bad = (
	# [http part, location part, directive, value in the message]
	['yarl_roots 127.0.0.1:7700;', '', 'yarl_roots', '127.0.0.1:7700'],
	['yarl_roots ftp://r:7700;', '', 'yarl_roots', 'ftp://r:7700'],
	['yarl_zone 64k;', '', 'yarl_zone', '64k'],
	['yarl_zone 8g;', '', 'yarl_zone', '8g'],
	['yarl_sync_ca %%TESTDIR%%/missing.pem;', '', 'yarl_sync_ca', $t->testdir . '/missing.pem'],
	['yarl_sync_ca %%TESTDIR%%/index.html;', '', 'yarl_sync_ca', $t->testdir . '/index.html'],
	['yarl_roots http://r:99999;', '', 'yarl_roots', 'http://r:99999'],
	['yarl_roots http://a:1 http://a:1;', '', 'yarl_roots', 'http://a:1'],
	['yarl_sync_interval fast;', '', 'yarl_sync_interval', 'fast'],
	['yarl_sync_interval 0;', '', 'yarl_sync_interval', '0'],
	['yarl_sync_timeout -1s;', '', 'yarl_sync_timeout', '-1s'],
	['yarl_sync_interval 2h;', '', 'yarl_sync_interval', '2h'],
	['yarl_sync_timeout 400000000d;', '', 'yarl_sync_timeout', '400000000d'],
	['yarl_sync_early sometimes;', '', 'yarl_sync_early', 'sometimes'],
	['yarl_sync_answers some;', '', 'yarl_sync_answers', 'some'],
	['', 'yarl_status 200;', 'yarl_status', '200'],
	['', 'yarl_status 600;', 'yarl_status', '600'],
	['', 'yarl_status abc;', 'yarl_status', 'abc'],
	['', 'yarl_dry_run maybe;', 'yarl_dry_run', 'maybe'],
	['', 'yarl_retry_after yes;', 'yarl_retry_after', 'yes'],
	['', 'yarl_log_level debug;', 'yarl_log_level', 'debug'],
	['', 'yarl_check "bad name!";', 'yarl_check', 'bad name!'],
	# A template's own name: a bucket per key, none of its own to name.
	['', 'yarl_account api_key_*;', 'yarl_account', 'api_key_*'],
	['', 'yarl_concurrency gen_*;', 'yarl_concurrency', 'gen_*'],
	['', 'yarl_account q -5;', 'yarl_account', '-5'],
	['', 'yarl_account q 1.5;', 'yarl_account', '1.5'],
	['', 'yarl_account q 2000000000000;', 'yarl_account', '2000000000000'],
);
for my $case (@bad) {
	my ($http, $loc, $directive, $value) = @$case;
	conf($http, $loc);
	my ($rc, $out) = $t->test_config();
	isnt($rc, 0, "$directive $value refused");
	like($out, qr/\[emerg\] .*"\Q$value\E" in "\Q$directive\E" directive/,
		"$directive $value: [emerg] names directive and value") or diag($out);
}

# Duplicates, wrong contexts, arity: nginx's own wording, still [emerg] with the directive.
for my $case (
	['yarl_sync_interval 1s; yarl_sync_interval 2s;', '', qr/"yarl_sync_interval" directive is duplicate/],
	['', 'yarl_status 429; yarl_status 503;', qr/"yarl_status" directive is duplicate/],
	['', 'yarl_roots http://r:1;', qr/"yarl_roots" directive is not allowed here/],
	['', 'yarl_account a 1 2;', qr/invalid number of arguments in "yarl_account" directive/],
	['yarl_stats;', '', qr/"yarl_stats" directive is not allowed here/],
	['', 'yarl_check "q_$nosuchvar";', qr/unknown "nosuchvar" variable/],
	['yarl_sync_token "two words";', '', qr/"yarl_sync_token" directive/],
) {
	my ($http, $loc, $re) = @$case;
	conf($http, $loc);
	my ($rc, $out) = $t->test_config();
	isnt($rc, 0, "refused: $http$loc");
	like($out, qr/\[emerg\] .*$re/, "message for: $http$loc") or diag($out);
}

# yarl_stats conflicts with another content handler in the same location.
conf('', 'proxy_pass http://127.0.0.1:1; yarl_stats;');
($rc, $out) = $t->test_config();
isnt($rc, 0, 'yarl_stats with proxy_pass refused');
like($out, qr/\[emerg\] .*"yarl_stats" directive conflicts/, 'conflict message') or diag($out);

done_testing();
